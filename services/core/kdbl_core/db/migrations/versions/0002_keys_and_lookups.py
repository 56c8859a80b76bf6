"""Server keys (cursor signing) and the OIDC tenant lookup (see ../sql/0002_keys_and_lookups.sql).

Revision ID: 0002
Revises: 0001
"""

import secrets
from pathlib import Path

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0002_keys_and_lookups.sql"


def upgrade() -> None:
    raw = op.get_bind().connection.driver_connection
    raw.execute(_SQL.read_text())
    raw.execute("INSERT INTO server_keys (name, secret) VALUES ('cursor', %s)", (secrets.token_bytes(32),))


def downgrade() -> None:
    raw = op.get_bind().connection.driver_connection
    raw.execute("DROP FUNCTION IF EXISTS kdbl_tenant_by_name(text); DROP TABLE IF EXISTS server_keys;")
