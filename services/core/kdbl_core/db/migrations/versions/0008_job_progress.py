"""crawl leases that expire without progress, poison files (issue 12 item 1) (see ../sql/0008_job_progress.sql).

Revision ID: 0008
Revises: 0007
"""

from pathlib import Path

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0008_job_progress.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "ALTER TABLE crawl_items DROP COLUMN IF EXISTS breaks, DROP COLUMN IF EXISTS started_at;")
