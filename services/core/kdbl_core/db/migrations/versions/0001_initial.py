"""Initial schema, roles and row-level security (see ../sql/0001_initial.sql).

Revision ID: 0001
Revises:
"""

from pathlib import Path

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0001_initial.sql"


def upgrade() -> None:
    # Run through the driver directly: the file holds DO blocks, format('%I') and '::' casts
    # that SQLAlchemy's bind-parameter parsing must not touch.
    raw = op.get_bind().connection.driver_connection
    raw.execute(_SQL.read_text())


def downgrade() -> None:
    raw = op.get_bind().connection.driver_connection
    raw.execute(
        "DROP TABLE IF EXISTS audit, tokens, grants, corpus_stats, term_stats, postings, chunks, files, "
        "sources, tenants CASCADE; "
        "DROP FUNCTION IF EXISTS kdbl_token_lookup(text), kdbl_granted_files(), kdbl_whole_sources(), "
        "kdbl_subjects(), kdbl_tenant();"
    )
