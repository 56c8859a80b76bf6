"""The API's request path on a psycopg connection pool, without SQLAlchemy's per-transaction cost.

An empty RLS transaction (checkout, BEGIN + principal settings, COMMIT, check-in) cost 490 µs of API
CPU through SQLAlchemy's async engine and 220 µs on psycopg directly (docs/benchmarks.md); every MCP
call runs one, plus a token lookup. `Session` offers the one method the request path uses —
`execute(text_or_sql, params)` with `:name` placeholders, returning rows with attribute access — so
tool code runs unchanged on either. Readiness and /capacity use this pool too (they report what the
request path sees); start-up checks keep the SQLAlchemy engine. `ApiPool` also rides out database
restarts and outages (see its docstring).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout
from sqlalchemy import TextClause
from sqlalchemy.engine import URL

from kdbl_core.db.async_pool import _configure
from kdbl_core.db.driver import named_rows, pyformat
from kdbl_core.errors import Unavailable

log = logging.getLogger(__name__)

# Measured (tests/integration/test_db_restart.py, embedded PostgreSQL on 2 cores, pool of 10): before,
# a restart failed 20 of the next 40 requests (each dead connection failed a token lookup and then a
# transaction); in an outage requests got 500s, then each waited the pool's 30 s timeout, and service
# came back 7.5 s after the server (reconnect backoff); now a restart fails 0 of 30 (and 0 of a burst
# of 16), an outage answers 503 in <= 10 ms (a probe that cannot connect is refused at once, or gives
# up after libpq's minimum connect_timeout of 2 s when the host does not answer), and service resumes
# < 1 s after the server.
PROBE_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 2
RETRY_AFTER_S = 1
UNAVAILABLE_MESSAGE = "the database is unreachable; retry shortly"
LOST_MESSAGE = "the database connection was lost during the request; retry shortly"


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


def _connection_lost(exc: BaseException, raw: AsyncConnection[Any]) -> bool:
    return isinstance(exc, psycopg.OperationalError) and (raw.broken or raw.closed)


class ApiPool:
    """A fixed-size pool (no overflow connections: each would re-plan every prepared statement) that
    survives a database restart and fails fast while the database is down.

    - A connection found dead at the first statement of a unit of work (its BEGIN + principal
      settings, or an autocommit session's first statement) had done nothing yet, so the work is
      retried once. A dead connection means the server restarted or went away: every idle connection
      died with it, so the whole pool is retired and the database probed with one direct connection.
    - Up: a fresh pool serves the retry. Down: `Unavailable` (HTTP 503, JSON-RPC UNAVAILABLE,
      Retry-After) at once, and every later request too — without waiting for a connection — until a
      probe (one at a time, at most every `probe_interval_s`) connects again; then a fresh pool takes
      over and service resumes by itself.
    - A connection lost in the middle of a unit of work is `Unavailable` for that request (its
      transaction was rolled back by the server; nothing is retried after a statement ran).
    """

    def __init__(self, url: URL, size: int, *, probe_interval_s: float = PROBE_INTERVAL_S) -> None:
        self._conninfo = libpq_url(url)
        self._size = size
        self._probe_interval = probe_interval_s
        self._pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None  # None: the database is down
        self._last_probe = -math.inf
        self._reopening: asyncio.Task[AsyncConnectionPool[AsyncConnection[Any]]] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self._pool = await self._new_pool(timeout=30.0)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        for task in list(self._retiring):
            await task

    async def _new_pool(self, *, timeout: float) -> AsyncConnectionPool[AsyncConnection[Any]]:
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            self._conninfo, min_size=self._size, max_size=self._size, open=False, name="kdbl-api",
            timeout=30.0, max_lifetime=1800.0, configure=_configure,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S, "row_factory": named_rows})
        await pool.open(wait=True, timeout=timeout)
        return pool

    def _retire(self, pool: AsyncConnectionPool[AsyncConnection[Any]]) -> None:
        """Stop using `pool`: requests waiting in it get PoolClosed (and look again), connections still
        lent out are closed when they come back."""
        if self._pool is not pool:
            return  # another request retired it already
        self._pool = None
        self._last_probe = -math.inf  # the next request probes at once
        log.warning("database connection lost; retiring the connection pool", extra={"pool": pool.name})
        task = asyncio.get_running_loop().create_task(pool.close(timeout=5.0))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _reopen(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        """A fresh pool if a probe connects; `Unavailable` at once while the last probe failed less than
        `probe_interval_s` ago. Requests arriving during a probe wait for its answer (one probe at a time)."""
        if self._reopening is None:
            now = time.monotonic()
            if now - self._last_probe < self._probe_interval:
                raise Unavailable(UNAVAILABLE_MESSAGE, retry_after_sec=RETRY_AFTER_S)
            self._last_probe = now
            task = asyncio.get_running_loop().create_task(self._probe_and_open())
            task.add_done_callback(self._probe_done)
            self._reopening = task
        return await asyncio.shield(self._reopening)

    def _probe_done(self, task: asyncio.Task[AsyncConnectionPool[AsyncConnection[Any]]]) -> None:
        self._reopening = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have gone

    async def _probe_and_open(self) -> AsyncConnectionPool[AsyncConnection[Any]]:
        try:
            probe = await AsyncConnection.connect(self._conninfo, connect_timeout=CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            log.warning("database unreachable", extra={"error": type(exc).__name__})
            raise Unavailable(UNAVAILABLE_MESSAGE, retry_after_sec=RETRY_AFTER_S) from None
        await probe.close()
        if self._pool is None:
            try:
                self._pool = await self._new_pool(timeout=10.0)
            except PoolTimeout:
                raise Unavailable(UNAVAILABLE_MESSAGE, retry_after_sec=RETRY_AFTER_S) from None
            log.info("database reachable again; connection pool reopened")
        return self._pool

    async def _checkout(self) -> tuple[AsyncConnectionPool[AsyncConnection[Any]], AsyncConnection[Any]]:
        while True:
            pool = self._pool or await self._reopen()
            try:
                return pool, await pool.getconn()
            except PoolClosed:
                continue  # retired while this request waited: look again (probe or fail fast)
            except PoolTimeout:
                raise Unavailable("no database connection became free within 30 s",
                                  retry_after_sec=RETRY_AFTER_S) from None

    async def _start(self, first: Callable[[AsyncConnection[Any]], Awaitable[None]]
                     ) -> tuple[AsyncConnectionPool[AsyncConnection[Any]], AsyncConnection[Any]]:
        """A connection on which `first` ran; one found dead there is replaced once (nothing ran yet)."""
        for attempt in (1, 2):
            pool, raw = await self._checkout()
            try:
                await first(raw)
            except BaseException as exc:
                await pool.putconn(raw)  # the pool discards a broken connection
                if not _connection_lost(exc, raw):
                    raise
                self._retire(pool)
                if attempt == 2:
                    raise Unavailable(UNAVAILABLE_MESSAGE, retry_after_sec=RETRY_AFTER_S) from None
                continue
            return pool, raw
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def transaction(self, set_principal_sql: str, params: Mapping[str, Any]) -> AsyncIterator[Session]:
        """BEGIN and the principal's settings in one round trip; COMMIT on success, ROLLBACK on error."""
        sql = pyformat(set_principal_sql)

        async def begin(raw: AsyncConnection[Any]) -> None:
            async with raw.pipeline():
                await raw.execute(sql, params)

        pool, raw = await self._start(begin)
        try:
            async with raw:  # commits a clean exit, rolls back an exception (psycopg's connection block)
                yield Session(raw)
        except psycopg.OperationalError as exc:
            if _connection_lost(exc, raw):
                self._retire(pool)
                raise Unavailable(LOST_MESSAGE, retry_after_sec=RETRY_AFTER_S) from exc
            raise
        finally:
            await pool.putconn(raw)

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Session]:
        """A session outside any transaction, for idempotent one-statement lookups: a connection found
        dead at the session's first statement is replaced and the statement run again."""
        session = _AutocommitSession(self)
        try:
            yield session
        except psycopg.OperationalError as exc:
            if session.raw is not None and _connection_lost(exc, session.raw):
                if session.pool is not None:
                    self._retire(session.pool)
                raise Unavailable(LOST_MESSAGE, retry_after_sec=RETRY_AFTER_S) from exc
            raise
        finally:
            await session.release()

    async def ping(self) -> None:
        """One round trip through the request path's pool (readiness); `Unavailable` when down."""
        async with self.autocommit() as session:
            await session.execute("SELECT 1")


class _AutocommitSession(Session):
    """Checks a connection out at its first statement, so that statement can be retried on a fresh one."""

    __slots__ = ("_api_pool", "pool")

    def __init__(self, api_pool: ApiPool) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self._api_pool = api_pool
        self.pool: AsyncConnectionPool[AsyncConnection[Any]] | None = None

    async def execute(self, statement: TextClause | str, params: Mapping[str, Any] | None = None) -> Rows:
        if self.raw is not None:
            return await super().execute(statement, params)
        result: list[Rows] = []

        async def first(raw: AsyncConnection[Any]) -> None:
            await raw.set_autocommit(True)
            self.raw = raw
            try:
                result.append(await super(_AutocommitSession, self).execute(statement, params))
            except BaseException:
                self.raw = None
                await _restore(raw)
                raise

        self.pool, self.raw = await self._api_pool._start(first)
        return result[0]

    async def release(self) -> None:
        if self.raw is None or self.pool is None:
            return
        raw, pool, self.raw, self.pool = self.raw, self.pool, None, None
        await _restore(raw)
        await pool.putconn(raw)


async def _restore(raw: AsyncConnection[Any]) -> None:
    if not raw.closed:
        with contextlib.suppress(psycopg.Error):
            await raw.set_autocommit(False)
