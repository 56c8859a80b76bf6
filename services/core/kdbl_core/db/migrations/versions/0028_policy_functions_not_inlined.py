"""The row-level-security policies' visible sources and granted files as function scans, not inlined (issue 33).

kdbl_whole_sources() and kdbl_grant_files() are plain SQL functions, so PostgreSQL inlined their bodies into
every policy that names them — and a search's keyword statement names chunks, postings, files, bm25_lists,
bm25_dead, term_stats and corpus_stats, each with such a policy: its generic plan had 323 nodes and 183
subplans (sources and grants scans, with their own policies, once per reference) for ~10 index probes, and
PostgreSQL spent about half its CPU on a search initialising and freeing that tree (perf; docs/benchmarks.md
"Per-call cost (issue 33)"). A function with a SET clause is never inlined: each reference becomes one
Function Scan, run once per statement as a hashed subplan. Same bodies, same invoker's rights (the policies on
sources and grants still apply inside, as they did inlined), and the search_path pinned as the other K-Lake
functions pin it: the keyword statement plans to 201 nodes and 93 subplans and costs PostgreSQL 1.20–1.35 ms
of CPU instead of 1.90–2.05 (SciFact, 200 queries, the same rows).

Revision ID: 0028
Revises: 0027
"""

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

FUNCTIONS = ("kdbl_whole_sources()", "kdbl_grant_files()")


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "".join(f"ALTER FUNCTION {fn} SET search_path = pg_catalog, public;\n" for fn in FUNCTIONS))


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "".join(f"ALTER FUNCTION {fn} RESET search_path;\n" for fn in FUNCTIONS))
