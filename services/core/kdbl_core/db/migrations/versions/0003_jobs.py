"""Crawl job queue with leases, and files.index_runs (see ../sql/0003_jobs.sql).

Revision ID: 0003
Revises: 0002
"""

from pathlib import Path

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0003_jobs.sql"


def upgrade() -> None:
    raw = op.get_bind().connection.driver_connection
    raw.execute(_SQL.read_text())


def downgrade() -> None:
    raw = op.get_bind().connection.driver_connection
    raw.execute("DROP TABLE IF EXISTS crawl_items, crawl_jobs; "
                "DROP FUNCTION IF EXISTS kdbl_check(boolean, text, text); "
                "ALTER TABLE files DROP COLUMN IF EXISTS index_runs;")
