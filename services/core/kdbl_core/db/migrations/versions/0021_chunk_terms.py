"""Each chunk's terms on its row (`chunks.terms`, `chunks.tfs`): the keyword index's one record (issue 29).

Until now a chunk's terms lived only as postings rows, one per (term, chunk) with its primary-key entry:
~16 KB of a 21 KB chunk at 1M chunks, kept after the packed lists (bm25_lists, ~3.3 bytes a posting)
already held the same information for search. From this revision a chunk carries its own term vector:
`terms` its terms sorted and joined by spaces, `tfs` their tf in the same order (the postings' tf: body
and weighted header, at most 32,767; kdbl_core.content.analysis.chunk_terms reads them back): ~480 +
40 bytes for a 100-token chunk's 72 terms, where a text[] took 676 (too short for TOAST to compress):

- the packed lists are built from these vectors (kdbl_core.content.bm25_lists), and a build deletes the
  postings rows of the chunks it packed: postings are the bounded delta of what was written since the
  last build (the chunks with id > bm25_built.upto), not a second copy of the index;
- with the kdbl_bm25 extension a writer packs its own chunks' postings as one small generation of lists
  (`bm25_lists.gen` = minus its first chunk id, so the column becomes bigint) instead of postings rows;
  a build folds those into its generation;
- what needs a given chunk's terms reads them here: a file's deletion subtracts its chunks' document
  frequencies, the phrase check and find_similar's subject terms, scores of given chunks, files granted
  one by one (never in a list their reader sees);
- a database without the kdbl_bm25 extension never builds, so its postings stay whole (the SQL top-k).

Backfilled here from the postings, one batch of chunk ids at a time with a progress line each
(`kdbl-control db migrate` logs them): ~1 minute per 10M postings. The next build (the worker's after a
crawl, or `kdbl-control db compact`) packs the lists from the vectors and deletes the packed postings.
The rows are rewritten once, so the chunks table is twice its size until VACUUM reuses the old versions
(`db compact` runs VACUUM on it). Downgrade puts every postings row back from the vectors first.

Revision ID: 0021
Revises: 0020
"""

import logging
import time

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

log = logging.getLogger("kdbl_core.db.migrate")
BATCH = 50_000  # ids (files when filling, chunks when restoring) a statement

_FILL = """
UPDATE chunks c SET terms = v.terms, tfs = v.tfs
  FROM (SELECT p.chunk_id, string_agg(p.term, ' ' ORDER BY p.term) AS terms, array_agg(p.tf ORDER BY p.term) AS tfs
          FROM postings p
         WHERE p.file_id > %(lo)s AND p.file_id <= %(hi)s  -- postings_file_idx
         GROUP BY p.chunk_id) v
 WHERE c.id = v.chunk_id
"""
# Every chunk's postings that a build deleted, back from its vector (the downgrade).
_RESTORE = """
INSERT INTO postings (tenant_id, term, chunk_id, source_id, file_id, tf, dl)
SELECT c.tenant_id, t.term, c.id, c.source_id, c.file_id, t.tf, c.token_count
  FROM chunks c CROSS JOIN LATERAL unnest(string_to_array(c.terms, ' '), c.tfs) AS t(term, tf)
 WHERE c.id > %(lo)s AND c.id <= %(hi)s AND c.terms IS NOT NULL
ON CONFLICT (tenant_id, term, chunk_id) DO NOTHING
"""


def _batched(sql: str, table: str, what: str) -> None:
    """`sql` over ids (lo, hi] of `table`, BATCH ids a statement, a progress line after each."""
    conn = op.get_bind().connection.driver_connection
    lo, top = conn.execute(f"SELECT coalesce(min(id), 1) - 1, coalesce(max(id), 0) FROM {table}").fetchone()
    total, done, started = max(top - lo, 0), 0, time.monotonic()
    if total:
        log.info(f"migration 0021: {what}, {table} ids {lo + 1:,} to {top:,}")
    while lo < top:
        hi = min(lo + BATCH, top)
        conn.execute(sql, {"lo": lo, "hi": hi})
        done += hi - lo
        lo = hi
        log.info(f"migration 0021: {what}: {100 * done / total:.0f}% of {table} ids "
                 f"({time.monotonic() - started:.0f} s)")


def upgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    conn.execute("ALTER TABLE chunks ADD COLUMN terms text, ADD COLUMN tfs smallint[]")
    # A writer's own small generation is numbered by its first chunk id, negated (kdbl_core.content.store).
    conn.execute("ALTER TABLE bm25_lists ALTER COLUMN gen TYPE bigint")
    _batched(_FILL, "files", "each chunk's terms from its postings")


def downgrade() -> None:
    _batched(_RESTORE, "chunks", "postings back from each chunk's terms")
    conn = op.get_bind().connection.driver_connection
    conn.execute("DELETE FROM bm25_lists WHERE gen < 0")  # the writers' generations: their rows are back
    conn.execute("ALTER TABLE bm25_lists ALTER COLUMN gen TYPE integer")
    conn.execute("ALTER TABLE chunks DROP COLUMN IF EXISTS terms, DROP COLUMN IF EXISTS tfs")
