"""Packed BM25 posting lists (issue 19): bm25_lists, bm25_built, bm25_dead, the trigger that records
deleted chunks and the lock that orders a build after every chunk insert (sql/0017_bm25_lists.sql).

The kdbl_bm25 extension itself is created after the migrations when the server offers it
(kdbl_core.db.migrate.install_extension); the tables need nothing from it.

Revision ID: 0017
Revises: 0016
"""

from pathlib import Path

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
_SQL = Path(__file__).resolve().parent.parent / "sql" / "0017_bm25_lists.sql"


def upgrade() -> None:
    op.get_bind().connection.driver_connection.execute(_SQL.read_text(encoding="utf-8"))


def downgrade() -> None:
    op.get_bind().connection.driver_connection.execute("""
        DROP TRIGGER IF EXISTS chunks_bm25_write_lock ON chunks;
        DROP TRIGGER IF EXISTS chunks_bm25_dead ON chunks;
        DROP FUNCTION IF EXISTS kdbl_bm25_write_lock();
        DROP FUNCTION IF EXISTS kdbl_bm25_dead();
        DROP TABLE IF EXISTS bm25_dead, bm25_built, bm25_lists;
    """)
