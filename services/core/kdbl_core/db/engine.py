"""SQLAlchemy engines for the callers not yet on psycopg pools (issue 15: this module is deleted once
the worker, operator and control move to kdbl_core.db.connect; the request path no longer uses it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from kdbl_core.db.connect import ROLE_CHECK, check_runtime_role, principal_params
from kdbl_core.db.urls import normalise

__all__ = ["assert_runtime_role_sync", "async_engine", "check_runtime_role", "principal_params", "sync_engine",
           "tenant_transaction"]

_SET_PRINCIPAL = text(
    "SELECT set_config('kdbl.tenant_id', :tenant, true), set_config('kdbl.subjects', :subjects, true)")


def sync_engine(url: str, *, pool_size: int = 5) -> Engine:
    return create_engine(normalise(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True)


def async_engine(url: str, *, pool_size: int = 10, pre_ping: bool = False) -> AsyncEngine:
    return create_async_engine(
        normalise(url), pool_size=pool_size, max_overflow=0, pool_timeout=30, pool_pre_ping=pre_ping,
        pool_recycle=1800, connect_args={"connect_timeout": 2},
    )


@contextmanager
def tenant_transaction(engine: Engine, tenant_id: UUID) -> Iterator[Connection]:
    """A worker transaction limited to one tenant's rows."""
    with engine.begin() as conn:
        conn.execute(_SET_PRINCIPAL, {"tenant": str(tenant_id), "subjects": ""})
        yield conn


def assert_runtime_role_sync(engine: Engine, *, allow_privileged: bool) -> None:
    with engine.connect() as conn:
        row = conn.execute(text(ROLE_CHECK)).first()
    check_runtime_role(tuple(row) if row else None, allow_privileged=allow_privileged)
