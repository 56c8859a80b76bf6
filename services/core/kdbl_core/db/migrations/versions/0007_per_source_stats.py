"""Per-source BM25 statistics (issue 13 item 4): see ../sql/0007_per_source_stats.sql and its _down twin.

Revision ID: 0007
Revises: 0006
"""

from pathlib import Path

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0007_per_source_stats.sql"
_DOWN = _SQL.with_name("0007_per_source_stats_down.sql")


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_DOWN.read_text())
