"""The schema's one MetaData (kdbl_core.db.schema) describes exactly what the migrations build."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, pool

from kdbl_core.db import schema
from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.db.urls import normalise


def _include(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    return not (type_ == "index" and name and schema.IGNORED_INDEXES.match(name))


def _diff(url: str) -> list[Any]:
    engine = create_engine(normalise(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={
                "compare_type": True, "compare_server_default": True, "include_object": _include})
            return compare_metadata(context, schema.metadata)
    finally:
        engine.dispose()


def test_the_migrated_database_matches_the_schema_metadata(owner_url) -> None:
    assert _diff(owner_url) == []


def test_a_column_the_migrations_lack_shows_up_as_a_difference(pg_dir) -> None:
    with EmbeddedDatabase(pg_dir) as db:
        engine = create_engine(normalise(db.owner_url), poolclass=pool.NullPool)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE tenants DROP COLUMN display_name")
            conn.exec_driver_sql("CREATE INDEX chunks_embedding_8_hnsw ON chunks (id)")  # run-time index
        engine.dispose()
        diff = _diff(db.owner_url)
    assert [(d[0], d[3].name) for d in diff] == [("add_column", "display_name")]
