"""vacuum_truncate = false on the tables searches read (issue 32, read replicas; docs/scaling.md §1.4).

VACUUM truncating the empty pages at the end of a table takes an AccessExclusive lock, and that lock is
replayed on every hot standby: a search reading the table there waits for it, and past
max_standby_streaming_delay the standby cancels the search (SQLSTATE 40001, "conflict with recovery"). The
worker deletes and re-inserts a file's chunks, terms and lists at every re-index, so these tables are the
ones vacuum shrinks. Keeping their trailing free pages costs nothing lasting: the next crawl reuses them.
(`hot_standby_feedback = on` on the standbys removes the other routine conflict, row versions vacuum would
remove under a standby's snapshot; it is a server setting: the chart's CloudNativePG cluster sets it.)

Revision ID: 0027
Revises: 0026
"""

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

HOT_TABLES = ("chunks", "postings", "files", "term_stats", "corpus_stats", "source_stats", "index_generations",
              "bm25_lists", "bm25_dead", "entity_mentions", "entity_relations")


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "".join(f"ALTER TABLE {table} SET (vacuum_truncate = false);\n" for table in HOT_TABLES))


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "".join(f"ALTER TABLE {table} RESET (vacuum_truncate);\n" for table in HOT_TABLES))
