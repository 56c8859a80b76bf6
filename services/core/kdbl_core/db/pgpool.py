"""The API's request path on a psycopg connection pool, without SQLAlchemy's per-transaction cost.

An empty RLS transaction (checkout, BEGIN + principal settings, COMMIT, check-in) cost 490 µs of API
CPU through SQLAlchemy's async engine and 220 µs on psycopg directly (docs/benchmarks.md); every MCP
call runs one, plus a token lookup. `Session` offers the one method the request path uses —
`execute(text_or_sql, params)` with `:name` placeholders, returning rows with attribute access — so
tool code runs unchanged on either. Administrative paths (readiness, capacity, start-up checks) keep
the SQLAlchemy engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import TextClause
from sqlalchemy.engine import URL

from kdbl_core.db.driver import named_rows, pyformat


class Rows:
    """A fetched result: the subset of SQLAlchemy's Result the request path uses."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self._rows, self.rowcount = rows, rowcount

    def __iter__(self) -> Iterator[Any]:
        return iter(self._rows)

    def all(self) -> list[Any]:
        return list(self._rows)

    def first(self) -> Any | None:
        return self._rows[0] if self._rows else None

    def one(self) -> Any:
        if len(self._rows) != 1:
            raise LookupError(f"expected exactly one row, got {len(self._rows)}")
        return self._rows[0]

    def one_or_none(self) -> Any | None:
        if len(self._rows) > 1:
            raise LookupError(f"expected at most one row, got {len(self._rows)}")
        return self.first()

    def scalar(self) -> Any | None:
        return self._rows[0][0] if self._rows else None

    def scalar_one(self) -> Any:
        return self.one()[0]

    def mappings(self) -> Rows:
        return Rows([row._asdict() for row in self._rows], self.rowcount)


class Session:
    """One pooled connection inside a transaction (or in autocommit, for single statements)."""

    __slots__ = ("raw",)

    def __init__(self, raw: AsyncConnection[Any]) -> None:
        self.raw = raw

    async def execute(self, statement: TextClause | str, params: Mapping[str, Any] | None = None) -> Rows:
        sql = statement.text if isinstance(statement, TextClause) else statement
        async with self.raw.cursor(row_factory=named_rows) as cur:
            await cur.execute(pyformat(sql), params or {})
            rows = await cur.fetchall() if cur.description is not None else []
            return Rows(rows, cur.rowcount)


def libpq_url(url: URL) -> str:
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


class ApiPool:
    """A fixed-size pool (no overflow connections: each would re-plan every prepared statement)."""

    def __init__(self, url: URL, size: int) -> None:
        self._pool = AsyncConnectionPool(libpq_url(url), min_size=size, max_size=size, open=False,
                                         name="kdbl-api", timeout=30.0, max_lifetime=1800.0)

    async def open(self) -> None:
        await self._pool.open(wait=True, timeout=30.0)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def transaction(self, set_principal_sql: str, params: Mapping[str, Any]) -> AsyncIterator[Session]:
        """BEGIN and the principal's settings in one round trip; COMMIT on success, ROLLBACK on error."""
        async with self._pool.connection() as raw:
            # the pool commits a clean exit and rolls back an exception, then checks the connection in
            async with raw.pipeline():
                await raw.execute(pyformat(set_principal_sql), params)
            yield Session(raw)

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Session]:
        async with self._pool.connection() as raw:
            await raw.set_autocommit(True)
            try:
                yield Session(raw)
            finally:
                await raw.set_autocommit(False)
