"""The API's request path on an asynchronous psycopg pool: every MCP call, download and token lookup.

Statements run on psycopg's own `AsyncConnection` (no adapter): SQL with `%(name)s` / `%s`
placeholders, rows as named tuples with attribute access (`named_rows`; psycopg's `namedtuple_row`
refuses duplicate column names), vectors in binary through pgvector's adapter. Connections are in
autocommit; `transaction` begins with an explicit BEGIN pipelined with its first statement. An empty RLS
transaction costs ~220 µs of API CPU here against ~490 µs through SQLAlchemy's async engine
(docs/benchmarks.md), and every MCP call runs one.

`AsyncPool` also rides out database restarts and outages (see its docstring). Measured
(tests/integration/test_db_restart.py, embedded PostgreSQL on 2 cores, pool of 10): a restart fails
0 of 30 requests (and 0 of a burst of 16), an outage answers 503 in <= 10 ms (a probe that cannot
connect is refused at once, or gives up after libpq's minimum connect_timeout of 2 s when the host
does not answer), and service resumes < 1 s after the server. Before, a restart failed 20 of the next
40 requests and an outage made each request wait the pool's 30 s timeout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import namedtuple
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg import AsyncConnection, AsyncCursor
from psycopg.conninfo import conninfo_to_dict
from psycopg.types import TypeInfo
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from kdbl_core.db.replica import REPLAY, Replay, parse_lsn
from kdbl_core.errors import Unavailable

log = logging.getLogger(__name__)

Connection = AsyncConnection[Any]
Params = Mapping[str, Any] | Sequence[Any]

PROBE_INTERVAL_S = 1.0
CONNECT_TIMEOUT_S = 2  # libpq's minimum; a host that does not answer fails after this long
POOL_TIMEOUT_S = 30.0  # how long a request waits for a pooled connection
RETRY_AFTER_S = 1
UNAVAILABLE_MESSAGE = "the database is unreachable; retry shortly"
LOST_MESSAGE = "the database connection was lost during the request; retry shortly"


@dataclass(slots=True)
class Statement:
    """A statement to ride in a transaction's opening round trip (`AsyncPool.transaction(also=...)`):
    its rows are there once the transaction is open."""

    sql: str
    params: Params
    rows: list[Any] | None = None


@lru_cache(maxsize=512)
def _row_type(encoding: str, *names: bytes) -> Any:
    # rename: duplicate or non-identifier column names ("set_config" twice, "?column?") become _0, _1...
    return namedtuple("Row", [n.decode(encoding) for n in names], rename=True)  # noqa: PYI024


def named_rows(cursor: AsyncCursor[Any]) -> Callable[[Sequence[Any]], Any]:
    """psycopg row factory: named tuples (`row.key`, `row[0]`, `row._asdict()`), the class cached per
    column list (names come from the raw result)."""
    result = cursor.pgresult
    if result is None or not result.nfields:
        return tuple
    return _row_type(cursor.connection.info.encoding, *(result.fname(i) for i in range(result.nfields)))._make


# The keyword arm sums postings per chunk in a hash table: ~200,000-700,000 chunks for a SciFact query at
# 1M chunks, 15-45 MB. At PostgreSQL's default work_mem (4 MB, x2 for hashing) it spilled to disk in 5-21
# batches (EXPLAIN at 1M chunks, docs/benchmarks.md); the API's pool is small (one connection per
# concurrent request), so 32 MB per connection stays bounded.
SESSION_SETTINGS = "SET work_mem = '32MB'"


async def _configure(conn: Connection) -> None:
    # Before the migrations create the extension there is no `vector` type to register.
    if await TypeInfo.fetch(conn, "vector") is not None:
        await register_vector_async(conn)
    await conn.execute(SESSION_SETTINGS)
    # autocommit: transactions begin with an explicit BEGIN (AsyncPool.transaction), so no statement
    # here leaves one open


def _connection_lost(exc: BaseException, raw: Connection) -> bool:
    return isinstance(exc, psycopg.OperationalError) and (raw.broken or raw.closed)


class AsyncPool:
    """A fixed-size pool (no overflow connections: each would re-plan every prepared statement) that
    survives a database restart and fails fast while the database is down.

    - A connection found dead at the first statement of a unit of work (a transaction's BEGIN + its
      first statement, or `fetch`'s one statement) had done nothing yet, so the work is retried once.
      A dead connection means the server restarted or went away: every idle connection died with it,
      so the whole pool is retired and the database probed with one direct connection.
    - Up: a fresh pool serves the retry. Down: `Unavailable` (HTTP 503, JSON-RPC UNAVAILABLE,
      Retry-After) at once, and every later request too — without waiting for a connection — until a
      probe (one at a time, at most every `probe_interval_s`) connects again; then a fresh pool takes
      over and service resumes by itself.
    - A connection lost in the middle of a unit of work is `Unavailable` for that request (its
      transaction was rolled back by the server; nothing is retried after a statement ran).
    """

    def __init__(self, conninfo: str, size: int, *, name: str = "kdbl-api",
                 probe_interval_s: float = PROBE_INTERVAL_S, statement_timeout_ms: int | None = None) -> None:
        """`statement_timeout_ms`: every connection's default statement_timeout (a transaction may raise
        or lower it with SET LOCAL): a bound on statements outside any call's own deadline."""
        self._conninfo = conninfo
        self._options: dict[str, str] = {}
        if statement_timeout_ms:  # after any options the URL holds
            given = conninfo_to_dict(conninfo).get("options") or ""
            self._options["options"] = f"{given} -c statement_timeout={statement_timeout_ms}".strip()
        self._size = size
        self._name = name
        self._probe_interval = probe_interval_s
        self._pool: AsyncConnectionPool[Connection] | None = None  # None: the database is down
        self._last_probe = -math.inf
        self._reopening: asyncio.Task[AsyncConnectionPool[Connection]] | None = None
        self._retiring: set[asyncio.Task[None]] = set()

    @property
    def size(self) -> int:
        return self._size

    async def open(self) -> None:
        self._pool = await self._new_pool(timeout=POOL_TIMEOUT_S)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
        for task in list(self._retiring):
            await task

    async def _new_pool(self, *, timeout: float) -> AsyncConnectionPool[Connection]:
        pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            self._conninfo, min_size=self._size, max_size=self._size, open=False, name=self._name,
            timeout=POOL_TIMEOUT_S, max_lifetime=1800.0, configure=_configure,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_S, "row_factory": named_rows, "autocommit": True,
                    **self._options})
        await pool.open(wait=True, timeout=timeout)
        return pool

    def _retire(self, pool: AsyncConnectionPool[Connection]) -> None:
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

    async def _reopen(self) -> AsyncConnectionPool[Connection]:
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

    def _probe_done(self, task: asyncio.Task[AsyncConnectionPool[Connection]]) -> None:
        self._reopening = None
        if not task.cancelled():
            task.exception()  # retrieved here too: every waiter may have gone

    async def _probe_and_open(self) -> AsyncConnectionPool[Connection]:
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

    async def _checkout(self) -> tuple[AsyncConnectionPool[Connection], Connection]:
        while True:
            pool = self._pool or await self._reopen()
            try:
                return pool, await pool.getconn()
            except PoolClosed:
                continue  # retired while this request waited: look again (probe or fail fast)
            except PoolTimeout:
                raise Unavailable("no database connection became free within 30 s",
                                  retry_after_sec=RETRY_AFTER_S) from None

    async def _start(self, first: Callable[[Connection], Awaitable[None]]
                     ) -> tuple[AsyncConnectionPool[Connection], Connection]:
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
    async def transaction(self, first_sql: str, params: Params, *, also: Statement | None = None,
                          replay: Replay | None = None) -> AsyncIterator[Connection]:
        """BEGIN and `first_sql` (e.g. the principal's settings) in one round trip, with `also` (the
        caller's first statement, e.g. the search preflight: its rows land in `also.rows`) in the same
        one; COMMIT on a clean exit (nothing when the block already sent one: the audit row's pipeline),
        ROLLBACK on an error. Yields psycopg's connection. `replay`: filled with where the server has replayed
        the primary's WAL to (kdbl_core.db.replica: a read on a standby checks its lag), in the same round trip.

        The pool's connections are in autocommit and the BEGIN is an explicit statement of the
        pipeline: psycopg's own BEGIN (non-autocommit) is followed by a Sync that waits for its answer
        even in pipeline mode, so BEGIN and the settings cost two round trips (measured on the wire at
        589ca3d: a search_content call was 8 round trips, 6 with this and the audit pipeline)."""

        async def begin(raw: Connection) -> None:
            async with raw.pipeline():
                await raw.execute("BEGIN")
                await raw.execute(first_sql, params)
                position = await raw.execute(REPLAY) if replay is not None else None
                cur = await raw.execute(also.sql, also.params) if also is not None else None
            if also is not None and cur is not None:
                also.rows = await cur.fetchall()
            if replay is not None and position is not None:
                row = await position.fetchone()
                replay.standby, replay.lsn = bool(row.standby), parse_lsn(row.lsn)

        pool, raw = await self._start(begin)
        try:
            async with raw:  # commits a clean exit, rolls back an exception (psycopg's connection block)
                yield raw
        except psycopg.OperationalError as exc:
            if _connection_lost(exc, raw):
                self._retire(pool)
                raise Unavailable(LOST_MESSAGE, retry_after_sec=RETRY_AFTER_S) from exc
            raise
        finally:
            await pool.putconn(raw)

    async def fetch(self, sql: str, params: Params | None = None) -> list[Any]:
        """One statement outside any transaction (no BEGIN/COMMIT round trips), for idempotent lookups
        and single writes: a connection found dead at it is replaced and the statement run again.
        Returns its rows (empty for a statement without a result)."""
        rows: list[Any] = []

        async def run(raw: Connection) -> None:
            cur = await raw.execute(sql, params)  # the pool's connections are in autocommit
            if cur.description is not None:
                rows.extend(await cur.fetchall())

        pool, raw = await self._start(run)
        await pool.putconn(raw)
        return rows

    async def ping(self) -> None:
        """One round trip through the request path's pool (readiness); `Unavailable` when down."""
        await self.fetch("SELECT 1")
