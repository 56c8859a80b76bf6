"""The MCP endpoint over real HTTP: official Python SDK client, auth, validation, tenant isolation, audit."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import httpx
import jsonschema
import pytest
from helpers import db_of, make_corpus, running_api
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from sqlalchemy import text

from kdbl_api.app import create_app
from kdbl_control import admin
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings


@pytest.fixture(scope="module")
def api_url(owner_url):
    with running_api(owner_url, Settings(mcp_enabled=True, max_request_bytes=64_000)) as url:
        yield url


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("mcp")
    acme = make_corpus(owner_engine, worker_engine, root / "acme-docs", {
        "handbook.md": "# Handbook\n\nThe quarterly okapi migration report is due in March.\n\n" + "filler " * 300,
        "policy/travel.md": "Travel policy: economy class for flights under six hours.",
    }, tenant="acme-mcp")
    globex = make_corpus(owner_engine, worker_engine, root / "globex-docs", {
        "secret.md": "Globex okapi acquisition plan, strictly confidential.",
    }, tenant="globex-mcp")
    tokens = {
        "acme": admin.create_token(db_of(owner_engine), tenant_name="acme-mcp", name="agent")[0],
        "globex": admin.create_token(db_of(owner_engine), tenant_name="globex-mcp", name="agent")[0],
        "search_only": admin.create_token(db_of(owner_engine), tenant_name="acme-mcp", name="s",
                                          scopes=["kdbl.search"])[0],
        "admin": admin.create_token(db_of(owner_engine), tenant_name=None, name="root", admin=True)[0],
    }
    return {"acme": acme, "globex": globex, "tokens": tokens}


@asynccontextmanager
async def mcp(api_url, token, mode="legacy"):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(f"{api_url}/mcp", http_client=http), mode=mode) as client:
        yield client


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_search_through_the_official_client_returns_validated_structured_hits(api_url, world, mode):
    async with mcp(api_url, world["tokens"]["acme"], mode) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("search_content", {"query": "okapi migration"})
    assert {"search_content", "get_file_text"} <= set(tools)
    assert not result.is_error
    structured = result.structured_content
    jsonschema.validate(structured, tools["search_content"].output_schema)
    assert json.loads(result.content[0].text) == structured
    [hit] = structured["hits"]
    assert hit["key"] == "handbook.md" and hit["source_id"] == str(world["acme"].source_id)
    assert "<mark>okapi</mark>" in hit["snippet"] and "okapi migration" in hit["text"]
    assert hit["uri"] == f"kdbl://file/{world['acme'].source_id}/handbook.md"
    assert hit["url"] is None and hit["rank"] > 0 and structured["mode"] == "lexical"
    links = [c for c in result.content if c.type == "resource_link"]
    assert [link.uri for link in links] == [hit["uri"]]


async def test_get_file_text_returns_ordered_chunks_status_and_an_embedded_resource(api_url, world):
    async with mcp(api_url, world["tokens"]["acme"]) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        result = await client.call_tool("get_file_text", {"source_id": str(world["acme"].source_id),
                                                          "key": "handbook.md"})
    structured = result.structured_content
    jsonschema.validate(structured, tools["get_file_text"].output_schema)
    assert structured["status"] == "ok" and structured["truncated"] is False
    assert [c["seq"] for c in structured["chunks"]] == list(range(structured["total_chunks"]))
    assert structured["total_chunks"] > 1
    [embedded] = [c for c in result.content if c.type == "resource"]
    assert embedded.resource.uri == structured["uri"] and "okapi" in embedded.resource.text


async def test_another_tenants_content_is_invisible_through_both_tools(api_url, world):
    async with mcp(api_url, world["tokens"]["globex"]) as client:
        hits = (await client.call_tool("search_content", {"query": "okapi migration handbook"})).structured_content
        assert [h["key"] for h in hits["hits"]] == ["secret.md"]
        with pytest.raises(MCPError) as err:
            await client.call_tool("get_file_text", {"source_id": str(world["acme"].source_id),
                                                     "key": "handbook.md"})
    assert err.value.code == -32602 and "source_id" in err.value.message


@pytest.mark.parametrize("arguments, field", [
    ({"query": "x", "limit": 101}, "limit"),
    ({"query": "x", "limit": 0}, "limit"),
    ({}, "query"),
    ({"query": "x", "mode": "vector"}, "mode"),  # the eval-only mode of old; semantic is public
    ({"query": "x", "bogus": 1}, "bogus"),
    ({"query": "x", "modified_after": "last tuesday"}, "modified_after"),
    ({"query": "x", "source_id": "not-a-uuid"}, "source_id"),
    ({"query": "x", "source_id": "00000000-0000-0000-0000-000000000000"}, "source_id"),
    ({"query": "x" * 1001}, "query"),
])
async def test_invalid_arguments_are_a_jsonrpc_32602_naming_the_field(api_url, world, arguments, field):
    async with mcp(api_url, world["tokens"]["acme"]) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("search_content", arguments)
    assert err.value.code == -32602
    assert f"'{field}'" in err.value.message


async def test_missing_token_is_401_with_a_resource_metadata_challenge(api_url):
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{api_url}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        prm = await http.get(f"{api_url}/.well-known/oauth-protected-resource/mcp")
    assert resp.status_code == 401
    challenge = resp.headers["www-authenticate"]
    assert challenge.startswith("Bearer ") and 'resource_metadata="' in challenge
    assert prm.status_code == 200 and prm.json()["resource"] == f"{api_url}/mcp"
    assert set(prm.json()["scopes_supported"]) == {"kdbl.search", "kdbl.read"}


@pytest.mark.parametrize("token", ["kdblpat_0123456789abcdef_" + "x" * 43, "garbage", "kdblpat_"])
async def test_forged_tokens_are_401(api_url, token):
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{api_url}/mcp", headers={"Authorization": f"Bearer {token}"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert resp.status_code == 401 and 'error="invalid_token"' in resp.headers["www-authenticate"]


async def test_repeated_wrong_secrets_for_one_token_stay_401_and_the_genuine_token_still_works(
        api_url, owner_engine, world):
    token, _ = admin.create_token(db_of(owner_engine), tenant_name="acme-mcp", name="guessed")
    statuses = []
    async with httpx.AsyncClient() as http:
        for n in range(7):
            resp = await http.post(f"{api_url}/mcp", headers={"Authorization": f"Bearer {token[:-4]}{n:04d}"},
                                   json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            statuses.append(resp.status_code)
    assert statuses == [401] * 7  # refuted by the token's fingerprint: no lockout of the holder
    async with mcp(api_url, token) as client:
        assert len((await client.list_tools()).tools) == 6


async def test_revoked_token_is_401(api_url, owner_engine, world):
    token, row = admin.create_token(db_of(owner_engine), tenant_name="acme-mcp", name="temp")
    async with mcp(api_url, token) as client:
        await client.list_tools()
    admin.revoke_token(db_of(owner_engine), token)
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{api_url}/mcp", headers={"Authorization": f"Bearer {token}"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert resp.status_code == 401 and "revoked" in resp.json()["error"]["message"]


async def test_cluster_admin_token_is_403_saying_tools_are_tenant_scoped(api_url, world):
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{api_url}/mcp", headers={"Authorization": f"Bearer {world['tokens']['admin']}"},
                               json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert resp.status_code == 403 and "tenant-scoped" in resp.json()["error"]["message"]


async def test_a_call_outside_the_tokens_scopes_is_403_naming_the_scope(api_url, world):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "get_file_text", "arguments": {"source_id": str(world["acme"].source_id),
                                                              "key": "handbook.md"}}}
    async with httpx.AsyncClient() as http:
        resp = await http.post(f"{api_url}/mcp", json=body, headers={
            "Authorization": f"Bearer {world['tokens']['search_only']}",
            "Accept": "application/json, text/event-stream"})
    assert resp.status_code == 403 and "kdbl.read" in resp.json()["error"]["message"]
    assert 'error="insufficient_scope"' in resp.headers["www-authenticate"]


async def test_get_is_405_and_oversized_bodies_are_413(api_url, world):
    headers = {"Authorization": f"Bearer {world['tokens']['acme']}"}
    async with httpx.AsyncClient() as http:
        get = await http.get(f"{api_url}/mcp", headers=headers)
        big = await http.post(f"{api_url}/mcp", headers=headers, content=b"{" + b" " * 70_000 + b"}")
    assert get.status_code == 405 and get.headers["allow"] == "POST"
    assert big.status_code == 413


async def test_every_call_writes_an_audit_row(api_url, owner_engine, world):
    async with mcp(api_url, world["tokens"]["acme"]) as client:
        await client.call_tool("search_content", {"query": "travel policy", "limit": 5})
        with pytest.raises(MCPError):
            await client.call_tool("search_content", {"query": "travel", "limit": 500})
    rows = admin.audit_rows(db_of(owner_engine), tenant_name="acme-mcp", tool="search_content", limit=2)
    failed, ok = rows
    assert ok["status"] == "ok" and ok["arguments"] == {"query": "travel policy", "limit": 5}
    assert ok["principal"] == "user:agent" and ok["row_count"] >= 1 and "policy/travel.md" in ok["keys"]
    assert ok["client_ip"] == "127.0.0.1" and ok["duration_ms"] > 0
    assert failed["status"] == "error" and "limit" in failed["error"]


def test_mcp_disabled_answers_404(owner_url):
    from starlette.testclient import TestClient

    with TestClient(create_app(Settings(mcp_enabled=False), for_role(owner_url, "kdbl_api"))) as client:
        assert client.post("/mcp", json={}).status_code == 404
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").status_code == 200


def test_api_refuses_to_start_as_a_role_that_bypasses_rls(owner_url):
    from starlette.testclient import TestClient

    from kdbl_core.errors import ConfigError

    with pytest.raises(ConfigError, match="bypasses row-level security"):
        # the owner/superuser: RLS would not restrict it
        with TestClient(create_app(Settings(mcp_enabled=True), owner_url)):
            pass


def test_audit_is_not_readable_by_the_api_role(api_sync_engine):
    with pytest.raises(Exception, match="permission denied"):
        with api_sync_engine.connect() as conn:
            conn.execute(text("SELECT * FROM audit"))
