"""crawl_items.sidecar_key: the subtitle file paired with a media file (see ../sql/0005_item_sidecars.sql).

Revision ID: 0005
Revises: 0004
"""

from pathlib import Path

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0005_item_sidecars.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "ALTER TABLE crawl_items DROP COLUMN IF EXISTS sidecar_key;")
