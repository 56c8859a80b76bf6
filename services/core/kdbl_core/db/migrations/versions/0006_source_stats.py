"""source_stats: per-source file/chunk/embedded counters kept by triggers (see ../sql/0006_source_stats.sql).

Revision ID: 0006
Revises: 0005
"""

from pathlib import Path

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0006_source_stats.sql"
_PROGRESS_0004 = _SQL.with_name("0004_embedding_progress.sql")


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        DROP TRIGGER IF EXISTS files_counter_ins ON files;
        DROP TRIGGER IF EXISTS files_counter_del ON files;
        DROP TRIGGER IF EXISTS chunks_counter_ins ON chunks;
        DROP TRIGGER IF EXISTS chunks_counter_del ON chunks;
        DROP TRIGGER IF EXISTS chunks_counter_upd ON chunks;
        DROP FUNCTION IF EXISTS kdbl_files_counter();
        DROP FUNCTION IF EXISTS kdbl_chunks_counter();
        DROP FUNCTION IF EXISTS kdbl_add_source_stats(uuid[], text[], bigint[], bigint[]);
        DROP TABLE IF EXISTS source_stats;
    """)
    # back to 0004's counting kdbl_embedding_progress()
    op.get_bind().connection.driver_connection.execute(_PROGRESS_0004.read_text())
