"""Embedding model per chunk, per-dimension HNSW indexes, progress (see ../sql/0004_embeddings.sql).

Revision ID: 0004
Revises: 0003
"""

from pathlib import Path

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SQL = Path(__file__).resolve().parent.parent / "sql" / "0004_embeddings.sql"
PROGRESS_SQL = _SQL.with_name("0004_embedding_progress.sql")


def upgrade() -> None:
    driver = op.get_bind().connection.driver_connection
    driver.execute(_SQL.read_text())
    driver.execute(PROGRESS_SQL.read_text())


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute(
        "DROP FUNCTION IF EXISTS kdbl_embedding_progress(), kdbl_ensure_vector_index(integer); "
        "DROP INDEX IF EXISTS chunks_embedding_pending_idx; ALTER TABLE chunks DROP COLUMN IF EXISTS embedding_model;"
    )
