"""kdbl_terms(cfg, text): the one analysis of text into index terms, and files.index_format (issue 28).

- `kdbl_terms(cfg, text)` returns (term, tf): `to_tsvector`'s lexemes and their counts, plus the parts of
  compound lexemes, analysed again and counted as often as the compound: host, file and URL lexemes split at
  their separators (`3m_2018_10k.pdf` gives `3m`, `2018`, `10k`, `pdf`), a signed number the parser made of
  a hyphenated one loses its sign (`covid-19` gives `covid` and `-19`, and `-19` gives `19`; `2021-12-31`
  also gives `12` and `31`), and a word of letters and digits splits where they meet (`fy2018` gives `fy`
  and `2018`, `10k` gives `10` and `k`, `h1n1` gives `h`, `1`, `n`, `1`), unless it has more than three such
  boundaries (a hash, a serial number). So `FY2018` meets `2018`, and `10-K` (`10`, `k`) meets a file named
  `…_10K.pdf`. The write side (kdbl_core.content.store) and every query-side statement call this one
  function (kdbl_core.content.analysis.TERMS), so both sides analyse text identically by construction. It
  reads no table: IMMUTABLE, no SECURITY DEFINER, callable by every role. The parts of all of a text's
  compounds go through `to_tsvector` in one call per kind (two in all), not one per lexeme. On the
  long-document eval's 10,121 chunks: 826,380 -> 855,405 (term, chunk) pairs; ~90 µs more a chunk than
  `to_tsvector` alone (~170 µs), on 2 shared cores.
- `files.index_format`: the version of the analysis a file's postings were written with
  (kdbl_core.content.analysis.INDEX_FORMAT, 1 from here on: these terms and the chunk header). Existing
  rows get 0, and the crawl treats a file with chunks and an older format as changed
  (kdbl_worker.pipeline), so every file indexed before this migration is re-indexed by its source's next
  crawl, with no other action. A constant default: adding the column rewrites nothing.

Revision ID: 0019
Revises: 0018
"""

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

# Every name schema-qualified: the function has no SET search_path, which would stop the planner from
# inlining it into the statements that call it.
_UP = r"""
CREATE FUNCTION kdbl_terms(cfg regconfig, body text) RETURNS TABLE (term text, tf integer)
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    WITH raw AS MATERIALIZED (
        SELECT t.lexeme, pg_catalog.cardinality(t.positions) AS n
          FROM pg_catalog.unnest(pg_catalog.to_tsvector(cfg, body)) AS t
    ), sep AS MATERIALIZED (
        SELECT t.lexeme, pg_catalog.cardinality(t.positions) AS n
          FROM pg_catalog.unnest(pg_catalog.to_tsvector(cfg, (
              SELECT pg_catalog.string_agg(pg_catalog.repeat(
                         pg_catalog.regexp_replace(r.lexeme, '[_./:@]|^-', ' ', 'g') OPERATOR(pg_catalog.||) ' ', r.n), '')
                FROM raw r
               WHERE r.lexeme OPERATOR(pg_catalog.~) '[_/:@]|[[:alpha:]][.]|[.][[:alpha:]]|^-[[:digit:]]'))) AS t
    )
    SELECT x.term, CAST(pg_catalog.sum(x.n) AS integer) FROM (
        SELECT r.lexeme AS term, r.n FROM raw r
        UNION ALL
        SELECT s.lexeme, s.n FROM sep s
        UNION ALL
        SELECT t.lexeme, pg_catalog.cardinality(t.positions)
          FROM pg_catalog.unnest(pg_catalog.to_tsvector(cfg, (
              SELECT pg_catalog.string_agg(pg_catalog.repeat(pg_catalog.regexp_replace(pg_catalog.regexp_replace(w.lexeme,
                         '([[:alpha:]])([[:digit:]])', '\1 \2', 'g'), '([[:digit:]])([[:alpha:]])', '\1 \2', 'g')
                         OPERATOR(pg_catalog.||) ' ', w.n), '')
                FROM (SELECT r.lexeme, r.n FROM raw r UNION ALL SELECT s.lexeme, s.n FROM sep s) AS w
               WHERE w.lexeme OPERATOR(pg_catalog.~) '^[[:alnum:]]*([[:alpha:]][[:digit:]]|[[:digit:]][[:alpha:]])[[:alnum:]]*$'
                 AND pg_catalog.regexp_count(w.lexeme, '[[:alpha:]][[:digit:]]|[[:digit:]][[:alpha:]]')
                     OPERATOR(pg_catalog.<=) 3))) AS t
    ) x
    GROUP BY x.term
    $$;

ALTER TABLE files ADD COLUMN index_format smallint NOT NULL DEFAULT 0;
"""


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_UP)


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        ALTER TABLE files DROP COLUMN IF EXISTS index_format;
        DROP FUNCTION IF EXISTS kdbl_terms(regconfig, text);
    """)
