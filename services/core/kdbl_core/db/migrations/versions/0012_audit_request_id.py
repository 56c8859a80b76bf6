"""audit.request_id: the id that follows one call everywhere (the audit row, the JSON log line, the
X-Request-Id response header and the result's `meta.request_id`; issue 16).

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # nullable, no default: rows written before this migration have none; no index (an admin looks a
    # request up by tenant and time first, audit_tenant_ts_idx, then reads its id)
    op.get_bind().connection.driver_connection.execute("ALTER TABLE audit ADD COLUMN request_id text")


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("ALTER TABLE audit DROP COLUMN IF EXISTS request_id")
