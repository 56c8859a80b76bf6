"""Round trips of a call's RLS transaction: BEGIN and the principal's settings go in one, and the audit
row (the transaction's last statement) goes with the COMMIT in one.

Round trips are counted on the wire: libpq's trace of the pooled connection (one Sync or simple Query
per round trip), as in test_search_pipeline.py.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid

import psycopg
import pytest
from helpers import db_of
from sqlalchemy import text

from kdbl_api import audit
from kdbl_api.audit import AuditFacts
from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db import connect
from kdbl_core.db.async_pool import Statement
from kdbl_core.db.urls import for_role


@pytest.fixture
def principal(owner_engine, unique) -> Principal:
    tenant = admin.create_tenant(db_of(owner_engine), f"aud-{unique}")
    return Principal(tenant_id=tenant.id, tenant_name=tenant.name, subject=f"user:aud-{unique}")


def _row(principal: Principal, tenant_id: uuid.UUID | None = None) -> dict:
    facts = AuditFacts(source_ids=[], keys=["a.md"], row_count=1)
    row = audit.audit_row(principal, None, "search_content", {"query": "q"}, facts, time.perf_counter())
    if tenant_id is not None:
        row["tenant_id"] = tenant_id
    return row


def _round_trips(trace) -> int:
    trace.seek(0)
    sent = [line.split("\t") for line in trace.read().splitlines()]
    return sum(1 for f in sent if len(f) > 2 and f[0] == "F" and f[2] in ("Sync", "Query"))


async def test_begin_and_the_principals_settings_take_one_round_trip(owner_url, principal):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)  # one connection: the same each time
    try:
        async with rls_transaction(pool, principal) as first:
            pass
        with tempfile.TemporaryFile("w+") as trace:
            first.pgconn.trace(os.dup(trace.fileno()))
            first.pgconn.set_trace_flags(1)  # psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
            try:
                async with rls_transaction(pool, principal) as conn:
                    assert conn is first
                    began = _round_trips(trace)
                    row = (await (await conn.execute(
                        "SELECT current_setting('kdbl.tenant_id') AS tenant, current_setting('kdbl.subjects') AS s"
                    )).fetchall())[0]
            finally:
                first.pgconn.untrace()
            total = _round_trips(trace)
    finally:
        await pool.close()
    assert began == 1  # psycopg's own BEGIN would wait for its answer before the settings are sent: 2
    assert row.tenant == str(principal.tenant_id) and principal.subject in row.s.split("\x1f")
    assert total == 3  # BEGIN + settings, the SELECT, the COMMIT


async def test_a_calls_first_statement_rides_with_begin_and_is_answered_under_the_principals_rls(
        owner_url, principal):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    first = Statement("SELECT kdbl_tenant() AS tenant, current_setting('kdbl.subjects') AS s", {})
    try:
        async with rls_transaction(pool, principal) as conn:
            pass
        with tempfile.TemporaryFile("w+") as trace:
            conn.pgconn.trace(os.dup(trace.fileno()))
            conn.pgconn.set_trace_flags(1)
            try:
                async with rls_transaction(pool, principal, also=first):
                    began = _round_trips(trace)
            finally:
                conn.pgconn.untrace()
    finally:
        await pool.close()
    assert began == 1  # BEGIN, the settings and the statement: one round trip (two without `also`)
    assert first.rows is not None and len(first.rows) == 1
    assert first.rows[0].tenant == principal.tenant_id and principal.subject in first.rows[0].s.split("\x1f")


async def test_a_failing_first_statement_ends_the_transaction_and_leaves_the_connection_usable(
        owner_url, principal):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    try:
        with pytest.raises(psycopg.errors.DivisionByZero):
            async with rls_transaction(pool, principal, also=Statement("SELECT 1 / 0", {})):
                pytest.fail("the block must not run when the first statement failed")
        async with rls_transaction(pool, principal, also=Statement("SELECT kdbl_tenant() AS t", {})) as conn:
            again = (await (await conn.execute("SELECT 1 AS one")).fetchall())[0].one
    finally:
        await pool.close()
    assert again == 1


def _stored(owner_engine, principal: Principal) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM audit WHERE principal = :p"),
                            {"p": principal.subject}).scalar_one()


async def test_the_audit_row_and_the_commit_of_its_call_take_one_round_trip(api_pool, owner_engine, principal):
    with tempfile.TemporaryFile("w+") as trace:
        async with rls_transaction(api_pool, principal) as conn:
            await (await conn.execute("SELECT count(*) FROM sources")).fetchall()  # the call's own work
            conn.pgconn.trace(os.dup(trace.fileno()))
            conn.pgconn.set_trace_flags(1)  # psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
            try:
                await audit.write(conn, _row(principal))
            finally:
                conn.pgconn.untrace()
            status = conn.info.transaction_status
        trace.seek(0)
        sent = [line.split("\t") for line in trace.read().splitlines()]
    messages = [f[2] for f in sent if len(f) > 2 and f[0] == "F"]
    assert sum(1 for m in messages if m in ("Sync", "Query")) == 1, messages
    assert status == psycopg.pq.TransactionStatus.IDLE  # committed: the block's exit has nothing left to send
    assert _stored(owner_engine, principal) == 1


async def test_an_audit_row_the_database_refuses_fails_the_call_and_stores_nothing(api_pool, owner_engine,
                                                                                    principal):
    # row-level security lets the API append rows of its principal's tenant only
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        async with rls_transaction(api_pool, principal) as conn:
            await audit.write(conn, _row(principal, tenant_id=uuid.uuid4()))
    assert _stored(owner_engine, principal) == 0
    async with rls_transaction(api_pool, principal) as conn:  # the pooled connection is usable again
        await audit.write(conn, _row(principal))
    assert _stored(owner_engine, principal) == 1
