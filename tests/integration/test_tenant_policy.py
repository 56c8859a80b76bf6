"""Tenant policy enforced end to end over HTTP, set with `kdbl-control tenant update` (issue 12 item 2),
download links re-checked against their minting token (issue 13 item 3), refusals audited (item 3)."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlparse

import httpx
import pytest
from helpers import cli, db_of, make_corpus, running_api, running_fetch

from kdbl_control import admin
from kdbl_control.cli import main as cli_main
from kdbl_core.access import policy
from kdbl_core.settings import Settings

SIGNING = "p" * 48
FETCH_TOKEN = "policy-fetch-" + "y" * 32
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
PUBLIC = "http://public.example:8443"
SIX = {"search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files"}


def _call(name: str, arguments: dict, rid: int = 1) -> dict:
    return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


@pytest.fixture(scope="module")
def fetch_url(worker_engine):
    with running_fetch(worker_engine, FETCH_TOKEN) as url:
        yield url


def _settings(fetch_url: str) -> Settings:
    return Settings(mcp_enabled=True, download_signing_secret=SIGNING, internal_fetch_token=FETCH_TOKEN,
                    worker_fetch_url=fetch_url, api_public_url=PUBLIC)


@pytest.fixture(scope="module")
def replicas(owner_url, fetch_url):
    """Two API replicas on one database (as two pods)."""
    with running_api(owner_url, _settings(fetch_url)) as a, running_api(owner_url, _settings(fetch_url)) as b:
        yield a, b


@pytest.fixture
def tenant(owner_engine, worker_engine, tmp_path, unique):
    """A fresh tenant with one crawled file and a token."""
    name = f"pol-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "docs", {
        "report.md": "# Capybara report\n\nThe capybara census counted forty capybaras."}, tenant=name)
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    return {"name": name, "corpus": corpus, "token": token}


async def post(url: str, token: str, body: dict) -> httpx.Response:
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}/mcp", json=body, headers={**ACCEPT, "Authorization": f"Bearer {token}"})


async def until(check, what: str, timeout_s: float = 60.0):
    """Poll `check` (async) until it returns something truthy: policy changes reach replicas within ~2 s."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def _local(url: str, replica: str) -> str:
    parsed = urlparse(url)
    assert f"{parsed.scheme}://{parsed.netloc}" == PUBLIC
    return f"{replica}{parsed.path}?{parsed.query}"


async def _hit_url(replica: str, token: str) -> str:
    resp = await post(replica, token, _call("search_content", {"query": "capybara"}))
    return resp.json()["result"]["structuredContent"]["hits"][0]["url"]


async def _status(url: str, token: str, body: dict = LIST) -> int:
    return (await post(url, token, body)).status_code


async def test_a_disabled_tenant_is_refused_403_everywhere_on_every_replica_until_re_enabled(
        replicas, tenant, monkeypatch, capsys, owner_url, owner_engine):
    a, b = replicas
    token = tenant["token"]
    link = await _hit_url(a, token)
    changed = time.monotonic()
    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--enabled", "false")
    for replica in (a, b):
        await until(lambda r=replica: _refused(r, token), "403 on a replica")
    # running replicas, no restart: the policy is re-read every TTL_S (2 s); the bound leaves a loaded machine room
    assert time.monotonic() - changed < 10 * policy.TTL_S
    for replica in (a, b):
        resp = await post(replica, token, _call("search_content", {"query": "capybara"}))
        assert resp.status_code == 403 and "is disabled" in resp.json()["error"]["message"]
    async with httpx.AsyncClient() as http:
        dl = await http.get(_local(link, a))
    assert dl.status_code == 403 and "disabled" in dl.json()["error"]
    rows = admin.audit_rows(db_of(owner_engine), tenant_name=tenant["name"], status="denied")
    assert rows and all("disabled" in r["error"] for r in rows)

    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--enabled", "true")
    for replica in (a, b):
        await until(lambda r=replica: _ok(r, token), "re-enabled")
    async with httpx.AsyncClient() as http:
        assert (await http.get(_local(link, b))).status_code == 200


async def _refused(url: str, token: str) -> bool:
    return await _status(url, token) == 403


async def _ok(url: str, token: str) -> bool:
    return await _status(url, token) == 200


async def test_tools_outside_the_allowlist_are_hidden_and_refused_exactly_as_unknown_tools(
        replicas, tenant, owner_engine):
    a, _ = replicas
    token = tenant["token"]
    assert {t["name"] for t in (await post(a, token, LIST)).json()["result"]["tools"]} == SIX  # the default
    admin.update_tenant(db_of(owner_engine), tenant["name"], tools="search_content,list_sources")

    async def narrowed():
        names = {t["name"] for t in (await post(a, token, LIST)).json()["result"]["tools"]}
        return names == {"search_content", "list_sources"}

    await until(narrowed, "tools/list narrowed")
    args = {"source_id": str(tenant["corpus"].source_id), "key": "report.md"}
    refused = (await post(a, token, _call("get_file_text", args))).json()
    unknown = (await post(a, token, _call("no_such_tool", args))).json()
    assert refused["error"]["code"] == unknown["error"]["code"] == -32602
    assert refused["error"]["message"] == unknown["error"]["message"].replace("no_such_tool", "get_file_text")
    assert refused["error"]["data"] == unknown["error"]["data"] == {"field": "name"}
    assert (await post(a, token, _call("list_sources", {}))).json()["result"]["isError"] is False
    uri = f"kdbl://file/{tenant['corpus'].source_id}/report.md"
    read = await post(a, token, {"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": uri}})
    assert read.status_code == 403 and "get_file_text is not in its tool allowlist" in read.json()["error"]["message"]


async def test_a_lexical_only_tenant_gets_semantic_modes_degraded_with_a_reason(replicas, tenant, owner_engine):
    a, _ = replicas
    admin.update_tenant(db_of(owner_engine), tenant["name"], modes="lexical")

    async def degraded():
        result = (await post(a, tenant["token"], _call("search_content", {"query": "capybara", "mode": "hybrid"}))
                  ).json()["result"]["structuredContent"]
        return result if "not allowed" in (result["degraded_reason"] or "") else None

    result = await until(degraded, "policy degradation")
    assert result["mode"] == "lexical" and result["degraded"] is True and result["hits"]


async def test_per_token_limits_are_shared_by_replicas_with_retry_after_and_ratelimit_headers(
        replicas, tenant, owner_engine):
    a, b = replicas
    token = tenant["token"]
    admin.update_tenant(db_of(owner_engine), tenant["name"], rate_limit="2/m,100/h")
    await until(lambda: _policy_seen(a, token, "2;w=60"), "the new tier on replica a")
    await until(lambda: _policy_seen(b, token, "2;w=60"), "the new tier on replica b")
    # both replicas have seen the policy (and each took one request doing so): the minute bucket is empty
    limited = await post(b, token, LIST)
    assert limited.status_code == 429
    body = limited.json()["error"]
    assert 1 <= body["data"]["retry_after_sec"] <= 30 and int(limited.headers["retry-after"]) == body["data"][
        "retry_after_sec"]
    assert limited.headers["ratelimit-remaining"] == "0" and limited.headers["ratelimit-limit"] == "2"
    # initialize is never counted: a client can always connect and learn why it is refused
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    assert (await post(a, token, init)).status_code == 200
    other = admin.create_token(db_of(owner_engine), tenant_name=tenant["name"], name="other")[0]
    assert await _status(a, other) == 200  # per token: another token has its own buckets
    rows = admin.audit_rows(db_of(owner_engine), tenant_name=tenant["name"], status="rate_limited")
    assert len(rows) == 1 and rows[0]["tool"] == "tools/list" and "retry after" in rows[0]["error"]


async def _policy_seen(url: str, token: str, policy: str) -> bool:
    resp = await post(url, token, LIST)
    return resp.status_code == 200 and policy in resp.headers.get("ratelimit-policy", "")


async def test_a_tenant_tier_limits_all_its_tokens_together_and_capacity_shows_what_is_left(
        replicas, tenant, owner_engine, monkeypatch, capsys, owner_url):
    a, b = replicas
    first = tenant["token"]
    second = admin.create_token(db_of(owner_engine), tenant_name=tenant["name"], name="second")[0]
    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--rate-limit", "0",
        "--tenant-rate-limit", "3/m")
    await until(lambda: _policy_seen(a, first, "3;w=60"), "tenant tier")  # took 1 of 3 (maybe more)
    async with httpx.AsyncClient() as http:
        capacity = (await http.get(f"{b}/capacity", headers={"Authorization": f"Bearer {second}"})).json()
    assert capacity["rate_limit"]["tenant"] == {"per_minute": 3, "burst": 3}
    assert capacity["rate_limit"]["per_token"] == {}
    left = capacity["rate_limit"]["remaining"]["remaining"]
    assert 0 <= left <= 2
    statuses = [await _status(b if i % 2 else a, second if i % 2 else first) for i in range(left + 1)]
    assert statuses == [200] * left + [429]


async def test_download_policy_off_inline_and_attachment(replicas, tenant, owner_engine, monkeypatch, capsys,
                                                         owner_url):
    a, _ = replicas
    token = tenant["token"]
    link = _local(await _hit_url(a, token), a)
    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--downloads", "inline")

    async def inline_only():
        async with httpx.AsyncClient() as http:
            return (await http.get(link + "&dl=1")).status_code == 403

    await until(inline_only, "inline only")
    async with httpx.AsyncClient() as http:
        assert (await http.get(link)).status_code == 200
        attachment = await http.get(link + "&dl=1")
    assert "inline downloads only" in attachment.json()["error"]

    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--downloads", "off")

    async def no_links():
        hits = (await post(a, token, _call("search_content", {"query": "capybara"}))).json()[
            "result"]["structuredContent"]["hits"]
        return hits and hits[0]["url"] is None

    await until(no_links, "links not minted")
    async with httpx.AsyncClient() as http:
        old = await http.get(link)
    assert old.status_code == 403 and "disabled for this tenant" in old.json()["error"]

    cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--downloads", "attachment")
    await until(lambda: _url_minted(a, token), "links again")
    async with httpx.AsyncClient() as http:
        assert (await http.get(link + "&dl=1")).status_code == 200


async def _url_minted(url: str, token: str) -> bool:
    return (await _hit_url(url, token)) is not None


async def test_a_download_link_stops_working_when_its_minting_token_is_revoked(replicas, tenant, owner_engine):
    a, _ = replicas
    keeper = admin.create_token(db_of(owner_engine), tenant_name=tenant["name"], name="keeper")[0]
    revoked_link = _local(await _hit_url(a, tenant["token"]), a)
    kept_link = _local(await _hit_url(a, keeper), a)
    admin.revoke_token(db_of(owner_engine), tenant["token"])
    async with httpx.AsyncClient() as http:
        dead = await http.get(revoked_link)
        alive = await http.get(kept_link)
    assert dead.status_code == 403 and "revoked" in dead.json()["error"]
    assert alive.status_code == 200
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name=tenant["name"], tool="files/download",
                             status="denied")
    assert "revoked" in row["error"]


async def test_a_download_link_stops_working_when_its_minting_token_expires(replicas, tenant, owner_engine):
    from datetime import UTC, datetime, timedelta

    a, _ = replicas
    brief = admin.create_token(db_of(owner_engine), tenant_name=tenant["name"], name="brief",
                               expires_at=datetime.now(UTC) + timedelta(seconds=3))[0]
    link = _local(await _hit_url(a, brief), a)  # the link itself lives 15 minutes

    async def expired():
        async with httpx.AsyncClient() as http:
            resp = await http.get(link)
        assert resp.status_code in (200, 403)
        return resp if resp.status_code == 403 else None

    resp = await until(expired, "the minting token's expiry")
    assert "has expired" in resp.json()["error"]


async def test_calls_refused_before_a_tool_runs_each_leave_one_audit_row(
        replicas, tenant, owner_engine, monkeypatch, capsys, owner_url):
    a, _ = replicas
    name, token = tenant["name"], tenant["token"]
    search_only = admin.create_token(db_of(owner_engine), tenant_name=name, name="searcher",
                                     scopes=["kdbl.search"])[0]
    args = {"source_id": str(tenant["corpus"].source_id), "key": "report.md"}
    assert (await post(a, search_only, _call("get_file_text", args))).status_code == 403  # scope
    assert "error" in (await post(a, token, _call("no_such_tool", {}))).json()  # unknown tool
    assert "error" in (await post(a, token, _call("search_content", {"query": "x", "limit": 0}))).json()  # invalid
    assert (await post(a, token[:-4] + "zzzz", LIST)).status_code == 401  # a wrong secret for a known token
    assert (await post(a, token, _call("search_content", {"query": "capybara"}))).status_code == 200

    out = cli(monkeypatch, capsys, owner_url, "mcp", "audit", "--tenant", name, "--json")
    rows = json.loads(out)
    by_status = {}
    for row in rows:
        by_status.setdefault(row["status"], []).append(row)
    assert [r["tool"] for r in by_status["denied"]] == ["get_file_text"]
    assert "kdbl.read" in by_status["denied"][0]["error"] and by_status["denied"][0]["principal"] == "user:searcher"
    assert {r["tool"] for r in by_status["error"]} == {"no_such_tool", "search_content"}
    assert [r["principal"] for r in by_status["unauthenticated"]] == ["user:agent"]
    assert by_status["unauthenticated"][0]["error"] == "invalid token"
    [ok] = by_status["ok"]
    assert ok["source_ids"] == [str(tenant["corpus"].source_id)]
    assert token[20:] not in out and search_only[20:] not in out  # never the secret

    filtered = json.loads(cli(monkeypatch, capsys, owner_url, "mcp", "audit", "--tenant", name, "--json",
                              "--status", "error", "--tool", "search_content", "--principal", "agent",
                              "--since", "10m"))
    assert [r["tool"] for r in filtered] == ["search_content"] and "limit" in filtered[0]["error"]
    assert json.loads(cli(monkeypatch, capsys, owner_url, "mcp", "audit", "--tenant", name, "--json",
                          "--until", "2000-01-01T00:00Z")) == []
    table = cli(monkeypatch, capsys, owner_url, "mcp", "audit", "--tenant", name, "--status", "ok")
    assert "SOURCE_IDS" in table and str(tenant["corpus"].source_id) in table


def test_tenant_show_prints_the_effective_policy_and_update_validates_its_input(
        tenant, monkeypatch, capsys, owner_url):
    shown = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "show", tenant["name"], "--json"))
    assert shown["enabled"] is True and set(shown["tools"]) == SIX and shown["modes"] == ["lexical", "hybrid"]
    assert shown["downloads"] == "attachment" and shown["rate_limit"]["per_token"]["per_minute"] == 600
    updated = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--json",
                             "--rate-limit", "60/m,1000/h,5000/d", "--modes", "lexical", "--tools", "list_sources"))
    assert updated["rate_limit"]["per_token"] == {"per_minute": 60, "per_hour": 1000, "per_day": 5000, "burst": 60}
    assert updated["modes"] == ["lexical"] and updated["tools"] == ["list_sources"]
    monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
    for bad, field in ((["--rate-limit", "60/fortnight"], "rate-limit"), (["--tools", "rm_rf"], "tools"),
                       (["--modes", "psychic"], "modes"), (["--max-in-flight", "0"], "max-in-flight"),
                       (["--queue-ms", "soon"], "queue-ms"), (["--timeout", "5 fortnights"], "timeout"),
                       (["--timeout", "rm_rf=1s"], "timeout"), (["--timeout", "search_content=2h"], "timeout")):
        with pytest.raises(SystemExit) as done:
            cli_main(["tenant", "update", tenant["name"], *bad])
        assert done.value.code == 1 and f"'{field}'" in capsys.readouterr().err


def test_concurrency_and_deadlines_default_to_the_installations_and_update_per_tenant_and_per_tool(
        tenant, monkeypatch, capsys, owner_url):
    from kdbl_core import settings as settings_module

    monkeypatch.setattr(settings_module, "_current", settings_module._current)  # the CLI loads its own: put back
    shown = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "show", tenant["name"], "--json"))
    assert shown["concurrency"] == {"max_in_flight": 4, "queue_ms": 2000}  # KDBL_TENANT_MAX_IN_FLIGHT, _QUEUE_S
    assert shown["deadlines"] == {"default_ms": 10_000, "tools": {}}  # KDBL_CALL_TIMEOUT_S
    updated = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--json",
                             "--max-in-flight", "2", "--queue-ms", "0", "--timeout", "5s,answer=1.5m,list_files=250ms"))
    assert updated["concurrency"] == {"max_in_flight": 2, "queue_ms": 0}
    assert updated["deadlines"] == {"default_ms": 5000, "tools": {"list_files": 250, "answer": 90_000}}
    monkeypatch.setenv("KDBL_CALL_TIMEOUT_S", "30")  # the installation's default, where the tenant sets none
    again = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--json",
                           "--max-in-flight", "default", "--timeout", "search_content=1s"))
    assert again["concurrency"] == {"max_in_flight": 4, "queue_ms": 0}
    assert again["deadlines"] == {"default_ms": 30_000, "tools": {"search_content": 1000}}
    reset = json.loads(cli(monkeypatch, capsys, owner_url, "tenant", "update", tenant["name"], "--json",
                           "--queue-ms", "default", "--timeout", "default"))
    assert reset["concurrency"] == {"max_in_flight": 4, "queue_ms": 2000}
    assert reset["deadlines"] == {"default_ms": 30_000, "tools": {}}


async def test_a_flood_of_wrong_guesses_never_locks_the_genuine_holder_out_of_a_fresh_replica(
        replicas, tenant, owner_engine):
    a, b = replicas
    token = tenant["token"]
    forged = [token[:-4] + f"{n:04d}" for n in range(40)]
    async with httpx.AsyncClient() as http:
        statuses = await asyncio.gather(*(http.post(f"{a}/mcp", json=LIST, headers={
            **ACCEPT, "Authorization": f"Bearer {guess}"}) for guess in forged))
    assert {r.status_code for r in statuses} == {401}  # never 429: guesses cost no argon2 budget
    assert await _status(b, token) == 200  # b never verified this token before
    assert await _status(a, token) == 200
    assert len(admin.audit_rows(db_of(owner_engine), tenant_name=tenant["name"], status="unauthenticated",
                                limit=100)) == 40


async def test_a_call_that_fails_unexpectedly_is_audited_with_the_error_type_and_no_internals(
        replicas, tenant, owner_engine):
    from sqlalchemy import text

    a, _ = replicas
    with owner_engine.begin() as conn:  # a real fault: the API role loses a privilege list_sources needs
        conn.execute(text("REVOKE SELECT ON grants FROM kdbl_api"))
    try:
        resp = await post(a, tenant["token"], _call("list_sources", {}))
    finally:
        with owner_engine.begin() as conn:
            conn.execute(text("GRANT SELECT ON grants TO kdbl_api"))
    error = resp.json()["error"]
    assert error["code"] == -32603 and "grants" not in error["message"]
    [row] = admin.audit_rows(db_of(owner_engine), tenant_name=tenant["name"], tool="list_sources")
    assert row["status"] == "error" and row["error"] == "internal error (InsufficientPrivilege)"
