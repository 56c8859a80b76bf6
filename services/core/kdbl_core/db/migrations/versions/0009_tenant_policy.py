"""enforced tenant policy, shared rate-limit buckets, audit of refusals (issue 12 items 2-3) (see ../sql/0009_tenant_policy.sql).

Revision ID: 0009
Revises: 0008
"""

from pathlib import Path

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0009_tenant_policy.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "SELECT 1;  -- TODO(tenant_policy): undo ../sql/0009_tenant_policy.sql")
