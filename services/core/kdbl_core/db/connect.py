"""Connection pools: synchronous ones for the CLI, the worker and the operator (`sync_pool`), the
request path's `AsyncPool` (`async_pool`: the API, eval, bench), and the runtime-role check.

One driver at run time (psycopg 3 + psycopg_pool); SQLAlchemy only declares the schema
(kdbl_core.db.schema) for the migrations. SQL is written with psycopg's own `%(name)s` / `%s`
placeholders. `pool.connection()` is one transaction: COMMIT on a clean exit, ROLLBACK on an error.
Rows are named tuples (`namedtuple_row`: `row.id`, `row._asdict()`), or dicts where a caller asks
for `dict_row`. pgvector's adapter is registered on each new connection once the `vector` type
exists, so embeddings travel in binary instead of as formatted text.
"""

from __future__ import annotations

from typing import Any

import psycopg
from pgvector.psycopg import register_vector
from psycopg.rows import namedtuple_row
from psycopg.types import TypeInfo
from psycopg_pool import ConnectionPool

from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.db.urls import libpq
from kdbl_core.errors import ConfigError

Pool = ConnectionPool
Connection = psycopg.Connection[Any]
CONNECT_TIMEOUT_S = 2  # libpq's minimum; a host that does not answer fails after this long
POOL_TIMEOUT_S = 30.0  # how long a caller waits for a pooled connection


def conninfo(url: str) -> str:
    """A libpq URL from any URL the settings accept (postgres://, postgresql://, postgresql+psycopg://)."""
    return libpq(url)


def _configure(conn: psycopg.Connection[Any]) -> None:
    # Before the migrations create the extension there is no `vector` type to register.
    if TypeInfo.fetch(conn, "vector") is not None:
        register_vector(conn)
    conn.commit()  # TypeInfo.fetch opened a transaction; the pool wants the connection idle


def sync_pool(url: str, *, size: int = 5, name: str = "kdbl") -> ConnectionPool:
    """An open pool of up to `size` connections (one is opened at once, the rest on demand).

    The first connection is made here, directly: an unreachable or refusing server raises psycopg's
    OperationalError with the server's reason at once, where the pool would retry in the background
    and let the first caller wait out its 30 s timeout."""
    info = conninfo(url)
    psycopg.connect(info, connect_timeout=CONNECT_TIMEOUT_S).close()
    return ConnectionPool(info, min_size=1, max_size=size, name=name, open=True, timeout=POOL_TIMEOUT_S,
                          max_lifetime=1800.0, configure=_configure,
                          kwargs={"row_factory": namedtuple_row, "connect_timeout": CONNECT_TIMEOUT_S})




# --- the start-up check of a service's role ------------------------------------------------------

ROLE_CHECK = (
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


def assert_runtime_role_sync(pool: ConnectionPool, *, allow_privileged: bool) -> None:
    """`check_runtime_role` for the worker's pool (ConfigError when the role bypasses RLS)."""
    with pool.connection() as conn:
        row = conn.execute(ROLE_CHECK).fetchone()
    check_runtime_role(tuple(row) if row else None, allow_privileged=allow_privileged)


# --- the asynchronous request path (the API, eval and bench): kdbl_core.db.async_pool -------------

async def async_pool(url: str, *, size: int = 10, name: str = "kdbl-api") -> AsyncPool:
    """An open AsyncPool of `size` connections (all opened now; fails when the database is unreachable)."""
    pool = AsyncPool(conninfo(url), size, name=name)
    await pool.open()
    return pool


async def assert_runtime_role(pool: AsyncPool, *, allow_privileged: bool) -> None:
    """`check_runtime_role` for the API's pool (ConfigError when the role bypasses RLS)."""
    rows = await pool.fetch(ROLE_CHECK)
    check_runtime_role(tuple(rows[0]) if rows else None, allow_privileged=allow_privileged)


