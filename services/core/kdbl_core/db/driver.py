"""Hot-path statements run on psycopg directly, inside the caller's transaction.

Every search request runs the same statements (token lookup, principal settings, BM25, neighbours,
audit). Through SQLAlchemy's execution and result layers each cost ~110 µs more API CPU than on the
psycopg connection underneath (docs/benchmarks.md). The statements keep the `:name` placeholders of
the rest of the code base; they are rewritten once to psycopg's `%(name)s`. The caller's connection is
either SQLAlchemy's (tests, benchmarks, `kdbl-control`: these helpers borrow the psycopg connection
under it, the transaction stays SQLAlchemy's) or a `pgpool.Session` (the API).
"""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from psycopg import AsyncConnection as PsycopgConnection, AsyncCursor
from psycopg.rows import dict_row
from sqlalchemy.ext.asyncio import AsyncConnection

_PLACEHOLDER = re.compile(r"(?<![:\w]):(\w+)")


@lru_cache(maxsize=256)
def pyformat(sql: str) -> str:
    """`:name` placeholders as psycopg's `%(name)s` (`::type` casts and literal `%` are kept)."""
    return _PLACEHOLDER.sub(r"%(\1)s", sql.replace("%", "%%"))


@lru_cache(maxsize=512)
def _row_type(encoding: str, *names: bytes) -> Any:
    # rename: duplicate or non-identifier column names ("set_config" twice, "?column?") become _0, _1...
    return namedtuple("Row", [n.decode(encoding) for n in names], rename=True)  # noqa: PYI024


def named_rows(cursor: AsyncCursor[Any]) -> Callable[[Sequence[Any]], Any]:
    """psycopg row factory: rows with attribute access by column name, like SQLAlchemy's (psycopg's own
    namedtuple_row refuses duplicate names). Names come from the raw result, cached per column list."""
    result = cursor.pgresult
    if result is None or not result.nfields:
        return tuple
    return _row_type(cursor.connection.info.encoding, *(result.fname(i) for i in range(result.nfields)))._make


async def psycopg_connection(conn: AsyncConnection | Any) -> PsycopgConnection[Any]:
    """The psycopg connection under SQLAlchemy's, or a pgpool.Session's own (`.raw`)."""
    if not isinstance(conn, AsyncConnection):
        return conn.raw
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if not isinstance(driver, PsycopgConnection):
        raise TypeError(f"expected a psycopg connection, got {type(driver).__name__}")
    return driver


async def fetch(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[Any]:
    """All rows, as named tuples (attribute access, like SQLAlchemy rows)."""
    driver = await psycopg_connection(conn)
    async with driver.cursor(row_factory=named_rows) as cur:
        await cur.execute(pyformat(sql), params)
        return await cur.fetchall()


async def fetch_dicts(conn: AsyncConnection, sql: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
    driver = await psycopg_connection(conn)
    async with driver.cursor(row_factory=dict_row) as cur:
        await cur.execute(pyformat(sql), params)
        return await cur.fetchall()


async def execute(conn: AsyncConnection, sql: str, params: Mapping[str, Any], *, pipelined: bool = False) -> None:
    """Run a statement for its effect. `pipelined`: send it with the transaction's BEGIN in one round trip."""
    driver = await psycopg_connection(conn)
    if pipelined:
        async with driver.pipeline():
            await driver.execute(pyformat(sql), params)
    else:
        await driver.execute(pyformat(sql), params)
