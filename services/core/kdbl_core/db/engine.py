"""Engines and the row-level-security transactions every content access goes through."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from uuid import UUID

from typing import Any

from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection as PsycopgConnection
from psycopg.types import TypeInfo
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from kdbl_core.db import driver
from kdbl_core.db.async_pool import named_rows
from kdbl_core.db.pgpool import ApiPool, Session
from kdbl_core.db.urls import normalise
from kdbl_core.errors import ConfigError
from kdbl_core.principal import Principal

_SET_PRINCIPAL_SQL = (
    "SELECT set_config('kdbl.tenant_id', :tenant, true), set_config('kdbl.subjects', :subjects, true)"
)
_SET_PRINCIPAL = text(_SET_PRINCIPAL_SQL)
_SUBJECT_SEP = "\x1f"


def sync_engine(url: str, *, pool_size: int = 5) -> Engine:
    return create_engine(normalise(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


# Hot paths open transactions with `engine.begin()` (ending in COMMIT), never `engine.connect()` (which
# ends in ROLLBACK): psycopg drops its prepared-statement cache on every ROLLBACK, and re-planning the
# BM25 query costs more than executing it.
def async_engine(url: str, *, pool_size: int = 10, pre_ping: bool = False) -> AsyncEngine:
    # No pre-ping by default: it would add a round trip to every checkout of a hot path (tests, tools,
    # benchmarks). The API's engine serves only start-up checks and cached OIDC tenant lookups, where a
    # connection that died with a database restart must not fail a request: it pre-pings.
    # Dead connections are recycled after 30 minutes and a failed statement invalidates its connection.
    # No overflow: under a burst, requests queue for one of `pool_size` long-lived connections. Overflow
    # connections are closed again on check-in, so every burst paid a backend start-up and re-planned
    # every prepared statement (16 clients: ~half the requests ran on a brand-new connection).
    return create_async_engine(
        normalise(url), pool_size=pool_size, max_overflow=0, pool_timeout=30, pool_pre_ping=pre_ping,
        pool_recycle=1800, connect_args={"connect_timeout": 2},
    )


def principal_params(principal: Principal) -> dict[str, str]:
    for subject in principal.subjects:
        if _SUBJECT_SEP in subject:
            raise ValueError("subject contains a separator character")
    return {"tenant": str(principal.tenant_id), "subjects": _SUBJECT_SEP.join(principal.subjects)}


# What the request path runs statements on: SQLAlchemy's async connection (tests, tools, benchmarks) or
# the API's psycopg pool session (pgpool.py). Both take `execute(text(...), params)`.
ContentDb = AsyncEngine | ApiPool
ContentConnection = AsyncConnection | Session


@asynccontextmanager
async def rls_transaction(db: ContentDb, principal: Principal) -> AsyncIterator[PsycopgConnection[Any]]:
    """One transaction scoped to `principal`: the settings vanish at commit/rollback (SET LOCAL).

    Transitional (issue 15): yields the psycopg connection (named-tuple rows, binary vectors) that the
    search core and reads take; connect.rls_transaction replaces this once callers hold an AsyncPool."""
    params = principal_params(principal)
    if isinstance(db, ApiPool):
        async with db.transaction(_SET_PRINCIPAL_SQL, params) as session:
            yield session.raw
        return
    async with db.begin() as conn:
        await driver.execute(conn, _SET_PRINCIPAL_SQL, params, pipelined=True)
        raw = await driver.psycopg_connection(conn)
        if raw.adapters.types.get("vector") is None and await TypeInfo.fetch(raw, "vector") is not None:
            await register_vector_async(raw)
        factory, raw.row_factory = raw.row_factory, named_rows
        try:
            yield raw
        finally:
            raw.row_factory = factory


@asynccontextmanager
async def autocommit_connection(db: ContentDb) -> AsyncIterator[ContentConnection]:
    """A connection outside any transaction, for one-statement lookups (no BEGIN/COMMIT round trips)."""
    if isinstance(db, ApiPool):
        async with db.autocommit() as session:
            yield session
        return
    async with db.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        yield conn


@contextmanager
def tenant_transaction(engine: Engine, tenant_id: UUID) -> Iterator[Connection]:
    """A worker transaction limited to one tenant's rows."""
    with engine.begin() as conn:
        conn.execute(_SET_PRINCIPAL, {"tenant": str(tenant_id), "subjects": ""})
        yield conn


_ROLE_CHECK = text(
    "SELECT r.rolsuper, r.rolbypassrls, "
    "EXISTS (SELECT 1 FROM pg_tables t WHERE t.tableowner = current_user AND t.schemaname = 'public') "
    "FROM pg_roles r WHERE r.rolname = current_user"
)


def check_runtime_role(row: tuple[bool, bool, bool] | None, *, allow_privileged: bool) -> None:
    """Refuse to serve as a role that row-level security would not restrict."""
    if row is None or allow_privileged:
        return
    superuser, bypass, owner = row
    if superuser or bypass or owner:
        raise ConfigError(
            "the database role of this service bypasses row-level security (superuser, BYPASSRLS or "
            "table owner); connect as kdbl_api / kdbl_worker, or set KDBL_ALLOW_PRIVILEGED_DB_ROLE=true"
        )


async def assert_runtime_role(engine: AsyncEngine, *, allow_privileged: bool) -> None:
    async with engine.connect() as conn:
        row = (await conn.execute(_ROLE_CHECK)).first()
    check_runtime_role(tuple(row) if row else None, allow_privileged=allow_privileged)


def assert_runtime_role_sync(engine: Engine, *, allow_privileged: bool) -> None:
    with engine.connect() as conn:
        row = conn.execute(_ROLE_CHECK).first()
    check_runtime_role(tuple(row) if row else None, allow_privileged=allow_privileged)
