"""Every migration downgrades and upgrades again on a real database (a fresh embedded server)."""

from __future__ import annotations

from sqlalchemy import text

from kdbl_core.db import migrate
from kdbl_core.db.embedded import EmbeddedDatabase
from kdbl_core.db.engine import sync_engine


def _progress_body(url: str) -> str | None:
    engine = sync_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(text(
                "SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = 'kdbl_embedding_progress'"
            )).scalar()
    finally:
        engine.dispose()


def test_down_to_the_first_migration_and_up_again(pg_dir) -> None:
    with EmbeddedDatabase(pg_dir) as db:
        url = db.owner_url
        head = migrate.current_revision(url)
        assert head is not None and "source_stats" in (_progress_body(url) or "")
        migrate.downgrade(url, "0005")  # 0006 gives the function back its 0004 body
        body = _progress_body(url) or ""
        assert "count(c.embedding)" in body and "source_stats" not in body
        migrate.downgrade(url, "0001")
        assert migrate.current_revision(url) == "0001" and _progress_body(url) is None
        migrate.upgrade(url)
        assert migrate.current_revision(url) == head and "source_stats" in (_progress_body(url) or "")
