"""Fair share and deadlines over real HTTP (issue 27 §3 and §5): a tenant's calls in flight are bounded per
API process (429 + Retry-After past it, audited) while other tenants are still served, and every call has
a deadline set by the tenant's policy (JSON-RPC -32008 past it, audited `timeout`, its connection back in
the pool); both are set with `kdbl-control tenant update` and counted in /metrics.

A call is held in flight deterministically: the test holds an ACCESS EXCLUSIVE lock on `source_stats`,
which list_sources reads and search_content does not, so one tenant's list_sources waits for the test
while another tenant's searches run. No assertion is about speed."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from helpers import cli, db_of, free_port, make_corpus
from sqlalchemy import text

from kdbl_api import main
from kdbl_api.app import create_app
from kdbl_control import admin
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings

ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
LIST_SOURCES = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "list_sources", "arguments": {}}}
SEARCH = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "search_content", "arguments": {"query": "capybara"}}}


@pytest.fixture(scope="module")
def api(owner_url) -> Iterator[Settings]:
    """The API on its port and its metrics port (kdbl-api's uvicorn options), no rate tiers, a pool of 4."""
    settings = Settings(mcp_enabled=True, api_host="127.0.0.1", api_port=free_port(), metrics_port=free_port(),
                        db_pool_size=4, rate_limit_per_minute=0)
    server = uvicorn.Server(uvicorn.Config(create_app(settings, for_role(owner_url, "kdbl_api")),
                                           **main.SERVER_OPTIONS))
    thread = threading.Thread(target=server.run, kwargs={"sockets": main.listen_sockets(settings)}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "API did not start"
        time.sleep(0.05)
    yield settings
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def tenants(owner_engine, worker_engine, tmp_path, unique) -> dict[str, dict[str, str]]:
    """Two fresh tenants, each with one crawled file and an agent token."""
    out = {}
    for who in ("busy", "calm"):
        name = f"{who}-{unique}"
        make_corpus(owner_engine, worker_engine, tmp_path / who, {
            "report.md": "# Capybara report\n\nThe capybara census counted forty capybaras."}, tenant=name)
        out[who] = {"name": name, "token": admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]}
    return out


def _url(settings: Settings, port: int | None = None) -> str:
    return f"http://127.0.0.1:{port or settings.api_port}"


async def post(settings: Settings, token: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.post(f"{_url(settings)}/mcp", json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"})


async def capacity(settings: Settings, token: str) -> dict:
    async with httpx.AsyncClient() as http:
        return (await http.get(f"{_url(settings)}/capacity", headers={"Authorization": f"Bearer {token}"})).json()


async def metric(settings: Settings, name: str, **labels: str) -> float:
    async with httpx.AsyncClient() as http:
        body = (await http.get(f"{_url(settings, settings.metrics_port)}/metrics")).text
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = re.escape(name + (f"{{{wanted}}}" if labels else "")) + r" ([0-9.e+-]+)\n"
    found = re.search(pattern, body)
    return float(found.group(1)) if found else 0.0


async def until(check, what: str, timeout_s: float = 20.0):
    """Poll `check` (async) until it returns something truthy (policies reach the API within ~2 s)."""
    deadline = time.monotonic() + timeout_s
    while not (result := await check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
    return result


@contextmanager
def source_stats_locked(owner_engine) -> Iterator[None]:
    """list_sources blocks until the block ends (its statement reads source_stats); searches do not."""
    with owner_engine.begin() as conn:
        conn.execute(text("LOCK TABLE source_stats IN ACCESS EXCLUSIVE MODE"))
        yield


async def blocked_backend(owner_engine) -> int | None:
    """The API backend waiting for the test's lock, when there is one."""
    with owner_engine.connect() as conn:
        return conn.execute(text(
            "SELECT pid FROM pg_stat_activity WHERE usename = 'kdbl_api' AND wait_event_type = 'Lock' "
            "AND query LIKE '%source_stats%'")).scalar()


def api_backends(owner_engine) -> set[int]:
    with owner_engine.connect() as conn:
        return set(conn.execute(text("SELECT pid FROM pg_stat_activity WHERE usename = 'kdbl_api'")).scalars())


async def test_a_tenant_at_its_call_limit_gets_429_with_retry_after_audited_while_another_tenant_is_served(
        api, tenants, owner_engine, owner_url, monkeypatch, capsys):
    busy, calm = tenants["busy"], tenants["calm"]
    shown = cli(monkeypatch, capsys, owner_url, "tenant", "update", busy["name"], "--max-in-flight", "1",
                "--queue-ms", "0", "--json")
    assert '"max_in_flight": 1' in shown and '"queue_ms": 0' in shown
    await until(lambda: _limit_seen(api, busy["token"], 1), "the new limit on the API")
    refused_before = await metric(api, "kdbl_call_slots_refused_total", reason="full")

    with source_stats_locked(owner_engine):
        held = asyncio.create_task(post(api, busy["token"], LIST_SOURCES))
        await until(lambda: blocked_backend(owner_engine), "the busy tenant's call to hold its one slot")
        # (not /capacity here: its embedding progress reads source_stats too)
        assert await metric(api, "kdbl_call_slots_in_use") == 1 and await metric(api, "kdbl_call_slots_full") == 1
        refused = await post(api, busy["token"], SEARCH)
        served = await post(api, calm["token"], SEARCH)
        assert not held.done()
    listed = await held

    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert error["code"] == -32029 and error["data"] == {"retry_after_sec": 1, "in_flight": 1, "max_in_flight": 1,
                                                         "cost": 1}
    assert f"tenant '{busy['name']}' has 1 of its 1 call slots in use" in error["message"]
    assert f"kdbl-control tenant update {busy['name']} --max-in-flight" in error["message"]
    assert served.status_code == 200 and served.json()["result"]["structuredContent"]["hits"]
    assert listed.status_code == 200 and listed.json()["result"]["structuredContent"]["sources"]
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name=busy["name"], status="rate_limited")
    assert row["tool"] == "search_content" and "call slots" in row["error"]
    assert await metric(api, "kdbl_call_slots_refused_total", reason="full") == refused_before + 1
    assert await metric(api, "kdbl_call_slots_in_use") == 0 and await metric(api, "kdbl_call_slots_full") == 0
    assert (await post(api, busy["token"], SEARCH)).status_code == 200  # its slot is free again


async def _limit_seen(settings: Settings, token: str, limit: int) -> bool:
    return (await capacity(settings, token))["concurrency"]["max_in_flight"] == limit


async def test_a_call_past_its_deadline_answers_what_to_change_is_audited_and_its_connection_serves_the_next(
        api, tenants, owner_engine, owner_url, monkeypatch, capsys):
    busy = tenants["busy"]
    cli(monkeypatch, capsys, owner_url, "tenant", "update", busy["name"], "--timeout", "list_sources=300ms")
    await until(lambda: _deadline_seen(api, busy["token"]), "the new deadline on the API")
    exceeded_before = await metric(api, "kdbl_call_deadline_exceeded_total", tool="list_sources", where="statement")
    backends = api_backends(owner_engine)

    with source_stats_locked(owner_engine):
        call = asyncio.create_task(post(api, busy["token"], LIST_SOURCES))
        pid = await until(lambda: blocked_backend(owner_engine), "the call waiting for the lock")
        stopped = await call  # the lock is still held: only the deadline ends the call

    assert stopped.status_code == 200  # a tool's error travels in the JSON-RPC body, as every tool error does
    error = stopped.json()["error"]
    assert error["code"] == -32008 and error["data"] == {"deadline_ms": 300}
    assert "list_sources stopped at its deadline of 300 ms" in error["message"]
    assert f"kdbl-control tenant update {busy['name']} --timeout list_sources=" in error["message"]
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name=busy["name"], status="timeout")
    assert row["tool"] == "list_sources" and "deadline of 300 ms" in row["error"]
    assert await metric(api, "kdbl_call_deadline_exceeded_total", tool="list_sources",
                        where="statement") == exceeded_before + 1

    listed = await post(api, busy["token"], LIST_SOURCES)
    assert listed.status_code == 200 and listed.json()["result"]["structuredContent"]["sources"]
    assert pid in api_backends(owner_engine) and api_backends(owner_engine) == backends  # no connection replaced
    shown = (await capacity(api, busy["token"]))["deadlines"]
    assert shown == {"default_ms": 10_000, "tools": {"list_sources": 300}}


async def _deadline_seen(settings: Settings, token: str) -> bool:
    return (await capacity(settings, token))["deadlines"]["tools"].get("list_sources") == 300


async def test_calls_over_the_limit_wait_their_turn_instead_of_being_refused(api, tenants, owner_engine):
    calm = tenants["calm"]
    admin.update_tenant(db_of(owner_engine), calm["name"], queue_ms="60000")  # a queue no call outwaits here
    await until(lambda: _queue_seen(api, calm["token"], 60_000), "the new queue time on the API")
    answers = await asyncio.gather(*(post(api, calm["token"], SEARCH) for _ in range(12)))  # 3x the default 4
    assert [r.status_code for r in answers] == [200] * 12  # the ones over the limit waited their turn
    assert await metric(api, "kdbl_call_slots_in_use") == 0


async def _queue_seen(settings: Settings, token: str, queue_ms: int) -> bool:
    return (await capacity(settings, token))["concurrency"]["queue_ms"] == queue_ms
