"""From the Tenant resource through the real operator (kmock + real PostgreSQL) to the API's behaviour over
HTTP: enabled, tool allowlist, search modes, rate tiers and download policy (issue 12 item 2)."""

from __future__ import annotations

import time
from typing import Any

import anyio
import httpx
from helpers import Corpus, crawl, db_of, running_api
from operator_helpers import tenant

from kdbl_control import admin
from kdbl_core.settings import Settings

ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
SEARCH = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "search_content", "arguments": {"query": "okapi", "mode": "hybrid"}}}


async def _post(url: str, token: str, body: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}/mcp", json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"})


async def test_a_tenant_resources_policy_is_what_the_api_enforces_over_http(
        operator, owner_engine, worker_engine, owner_url, names, tmp_path):
    name = names("pol")
    await operator.create(tenant(name, enabled=False, hybrid=False,
                                 mcp={"tools": ["search_content", "list_sources"], "modes": ["lexical"]},
                                 rateLimit={"requestsPerMinute": 3, "tenant": {"requestsPerHour": 100}},
                                 downloads={"mode": "off"}))
    await operator.ready("Tenant", name)
    token = await operator.eventually(lambda: operator.secret_token("kdbl", f"kdbl-tenant-{name}-bootstrap"),
                                      what="bootstrap token")
    root = tmp_path / "docs"
    root.mkdir()
    (root / "okapi.md").write_text("The okapi is a forest giraffe.")
    src = admin.add_source(db_of(owner_engine), name, protocol="fs", config={"root": str(root)},
                           name="docs", force=True)

    settings = Settings(mcp_enabled=True, download_signing_secret="d" * 48, internal_fetch_token="f" * 40,
                        api_public_url="http://public.example")
    with running_api(owner_url, settings) as url:
        refused = await _post(url, token, LIST)
        assert refused.status_code == 403 and f"tenant '{name}' is disabled" in refused.json()["error"]["message"]

        await operator.patch("Tenant", name, {"spec": {"enabled": True}})
        await operator.eventually(lambda: admin.show_tenant(db_of(owner_engine),
                                                            name)["enabled"], what="enabled")
        crawl(worker_engine, Corpus(name, src.tenant_id, src.id, root))  # the worker skips disabled tenants
        deadline = time.monotonic() + 30
        while (listed := await _post(url, token, LIST)).status_code != 200:  # the first 200 takes 1 of 3
            assert listed.status_code == 403 and time.monotonic() < deadline, listed.text
            await anyio.sleep(0.1)
        assert {t["name"] for t in listed.json()["result"]["tools"]} == {"search_content", "list_sources"}
        assert listed.headers["ratelimit-limit"] == "3" and listed.headers["ratelimit-remaining"] == "2"

        found = (await _post(url, token, SEARCH)).json()["result"]["structuredContent"]  # 2 of 3
        assert found["mode"] == "lexical" and "not allowed" in found["degraded_reason"]
        assert found["hits"] and found["hits"][0]["url"] is None  # downloads off: no link minted

        outside = (await _post(url, token, {**SEARCH, "params": {"name": "get_file_metadata", "arguments": {
            "source_id": str(src.id), "key": "okapi.md"}}})).json()  # 3 of 3
        assert outside["error"]["message"] == "invalid argument 'name': unknown tool 'get_file_metadata'"
        limited = await _post(url, token, LIST)
        assert limited.status_code == 429 and limited.json()["error"]["data"]["retry_after_sec"] >= 1
