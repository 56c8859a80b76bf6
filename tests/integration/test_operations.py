"""Operations endpoints and limits: rate limiting, /capacity, protected-resource metadata (/metrics and
who may read /capacity: test_http_exposure.py)."""

from __future__ import annotations

import httpx
import pytest
from helpers import db_of, make_corpus, running_api

from kdbl_control import admin
from kdbl_core.settings import Settings

LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


@pytest.fixture(scope="module")
def env(owner_url, owner_engine, worker_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("ops")
    make_corpus(owner_engine, worker_engine, root / "ops-src", {"a.md": "the axolotl"}, tenant="ops")
    tokens = [admin.create_token(db_of(owner_engine), tenant_name="ops", name=f"t{i}")[0] for i in range(2)]
    settings = Settings(mcp_enabled=True, rate_limit_per_minute=60, rate_limit_burst=3,
                        api_public_url="https://kdbl.example")
    with running_api(owner_url, settings) as url:
        yield url, tokens


async def test_rate_limit_is_per_token_with_retry_after(env):
    url, (first, second) = env
    async with httpx.AsyncClient() as http:
        codes = [(await http.post(f"{url}/mcp", json=LIST, headers={**ACCEPT, "Authorization": f"Bearer {first}"}))
                 for _ in range(4)]
        other = await http.post(f"{url}/mcp", json=LIST, headers={**ACCEPT, "Authorization": f"Bearer {second}"})
    assert [r.status_code for r in codes] == [200, 200, 200, 429]
    limited = codes[-1]
    assert limited.json()["error"]["data"]["retry_after_sec"] >= 1
    assert int(limited.headers["retry-after"]) == limited.json()["error"]["data"]["retry_after_sec"]
    assert other.status_code == 200


async def test_capacity_reports_modes_and_measured_latency(env):
    url, (_, token) = env
    body = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "search_content", "arguments": {"query": "axolotl", "mode": "hybrid"}}}
    async with httpx.AsyncClient() as http:
        call = await http.post(f"{url}/mcp", json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"})
        capacity = (await http.get(f"{url}/capacity", headers={"Authorization": f"Bearer {token}"})).json()
        prm = (await http.get(f"{url}/.well-known/oauth-protected-resource")).json()
    structured = call.json()["result"]["structuredContent"]
    assert structured["mode"] == "lexical" and structured["degraded"] is True
    assert capacity["modes"]["lexical"]["available"] is True
    assert capacity["modes"]["lexical"]["latency"]["samples"] >= 1
    assert capacity["modes"]["hybrid"] == {**capacity["modes"]["hybrid"], "available": False, "served_as": "lexical"}
    assert prm["resource"] == "https://kdbl.example/mcp"


async def test_a_client_disconnecting_mid_request_leaves_no_open_transaction(env, owner_engine):
    import asyncio
    import json as jsonlib
    import time
    from urllib.parse import urlparse

    from sqlalchemy import text

    url, (_, token) = env
    parsed = urlparse(url)
    body = jsonlib.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                          "params": {"name": "search_content", "arguments": {"query": "axolotl"}}}).encode()
    for _ in range(5):
        reader, writer = await asyncio.open_connection(parsed.hostname, parsed.port)
        writer.write(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-11-25\r\n"
                     + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()
        writer.close()  # gone before the response
    deadline = time.monotonic() + 60  # the server notices a gone client within a second or two when idle
    while True:
        with owner_engine.connect() as conn:
            stuck = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = 'kdbl_api' "
                "AND state LIKE 'idle in transaction%'")).scalar()
        if stuck == 0 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert stuck == 0
