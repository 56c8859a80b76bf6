"""kdbl_api.deadlines on a real PostgreSQL (issue 27 §5): a call's transaction under its deadline.

What makes a call slow is deterministic: the test holds a transaction-level advisory lock that the call's
statement waits for, or the call waits on an event nobody sets. The deadline then passes for certain; no
assertion is about speed. Over HTTP (tenant policy, JSON-RPC error, audit, metrics):
tests/integration/test_tenant_fair_share.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from sqlalchemy import text

from kdbl_api.deadlines import GRACE_S, bounded_transaction
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.urls import for_role
from kdbl_core.errors import DeadlineExceeded

PRINCIPAL = Principal(tenant_id=uuid.uuid4(), tenant_name="slowpoke", subject="user:agent")


@contextmanager
def advisory_lock_held(owner_engine) -> Iterator[int]:
    """A transaction-level advisory lock held by the test until the block ends; yields its key."""
    key = uuid.uuid4().int % (2**62)
    with owner_engine.begin() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
        yield key


async def _pid(conn) -> int:
    return (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]


async def _pool_pids(api_pool) -> set[int]:
    """The backend of every pooled connection: two transactions at once hold both (the fixture's size 2)."""
    both = asyncio.Event()
    pids: set[int] = set()

    async def hold() -> None:
        async with rls_transaction(api_pool, PRINCIPAL) as conn:
            pids.add(await _pid(conn))
            if len(pids) == 2:
                both.set()
            await asyncio.wait_for(both.wait(), 30)

    await asyncio.gather(hold(), hold())
    return pids


def _state(owner_engine, pid: int) -> str | None:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT state FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).scalar()


async def test_a_statement_past_the_deadline_is_cancelled_by_the_server_and_its_connection_stays_in_the_pool(
        api_pool, owner_engine):
    before = await _pool_pids(api_pool)
    async with rls_transaction(api_pool, PRINCIPAL) as conn:
        default = (await (await conn.execute("SHOW statement_timeout")).fetchone())[0]
    seen: list[str] = []
    pid = None
    with advisory_lock_held(owner_engine) as key, pytest.raises(DeadlineExceeded) as stopped:
        async with bounded_transaction(api_pool, PRINCIPAL, tool="search_content", deadline_ms=200,
                                       on_exceeded=seen.append) as conn:
            pid = await _pid(conn)
            await conn.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": key})  # waits for the test's lock
    assert seen == ["statement"]
    error = stopped.value
    assert error.jsonrpc_code == -32008 and error.data == {"deadline_ms": 200}
    assert "search_content stopped at its deadline of 200 ms" in error.message
    assert "kdbl-control tenant update slowpoke --timeout search_content=" in error.message
    assert _state(owner_engine, pid) == "idle"  # rolled back, not closed
    assert await _pool_pids(api_pool) == before  # the same connections: none replaced
    async with rls_transaction(api_pool, PRINCIPAL) as conn:  # SET LOCAL: the timeout ended with its transaction
        assert (await (await conn.execute("SHOW statement_timeout")).fetchone())[0] == default


async def test_work_stalled_outside_sql_is_stopped_at_the_calls_bound(api_pool, owner_engine):
    seen: list[str] = []
    never = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(DeadlineExceeded):
        async with bounded_transaction(api_pool, PRINCIPAL, tool="answer", deadline_ms=100,
                                       on_exceeded=seen.append) as conn:
            pid = await _pid(conn)
            await never.wait()
    assert seen == ["call"]
    assert loop.time() - started >= 0.1 + GRACE_S  # the bound is the deadline plus the grace, not less
    assert _state(owner_engine, pid) == "idle"
    assert pid in await _pool_pids(api_pool)


async def test_a_statement_the_server_does_not_cancel_is_cancelled_from_python_and_the_connection_is_reused(
        api_pool, owner_engine):
    before = await _pool_pids(api_pool)
    seen: list[str] = []
    with advisory_lock_held(owner_engine) as key, pytest.raises(DeadlineExceeded):
        async with bounded_transaction(api_pool, PRINCIPAL, tool="list_files", deadline_ms=100,
                                       on_exceeded=seen.append) as conn:
            pid = await _pid(conn)
            await conn.execute("SET LOCAL statement_timeout = 0")  # as if the server never answered
            await conn.execute("SELECT pg_advisory_xact_lock(%(k)s)", {"k": key})
    assert seen == ["call"]
    assert _state(owner_engine, pid) == "idle"  # psycopg cancelled the statement, then rolled back
    assert await _pool_pids(api_pool) == before


async def test_errors_other_than_the_deadline_pass_through_unchanged(api_pool):
    from psycopg.errors import UndefinedTable

    with pytest.raises(UndefinedTable):
        async with bounded_transaction(api_pool, PRINCIPAL, tool="list_sources", deadline_ms=10_000) as conn:
            await conn.execute("SELECT * FROM no_such_table")
    with pytest.raises(TimeoutError):  # a TimeoutError of the work's own is not the call's deadline
        async with bounded_transaction(api_pool, PRINCIPAL, tool="list_sources", deadline_ms=10_000):
            raise TimeoutError("the work's own")


async def test_the_apis_pool_bounds_every_statement_also_outside_a_calls_deadline(owner_url):
    """The front door's lookups and /readyz run outside any call's transaction: the pool's connections carry
    the installation's call timeout as their default, after any options the URL holds."""
    from kdbl_core.db.async_pool import AsyncPool
    from psycopg.conninfo import make_conninfo

    from kdbl_core.db.connect import conninfo

    url = for_role(owner_url, "kdbl_api")
    pool = AsyncPool(make_conninfo(conninfo(url), options="-c application_name=kdbl-bounded"), 1,
                     statement_timeout_ms=250)
    await pool.open()
    try:
        assert (await pool.fetch("SHOW statement_timeout"))[0][0] == "250ms"
        assert (await pool.fetch("SHOW application_name"))[0][0] == "kdbl-bounded"
        with pytest.raises(psycopg.errors.QueryCanceled):
            await pool.fetch("SELECT pg_sleep(30)")
        assert (await pool.fetch("SELECT 1"))[0][0] == 1  # the connection serves the next statement
    finally:
        await pool.close()
