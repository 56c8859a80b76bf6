"""One request id follows a call everywhere (issue 16): every tool result's `meta` (request_id, took_ms by
part, cache_hit) through the official MCP client and the tool's outputSchema, the `X-Request-Id`
response header (refusals too), the audit row's request_id and the call's JSON log line."""

from __future__ import annotations

import json
import logging
import re
import uuid
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

from kdbl_api.request_meta import CallMeta, sane_id
from kdbl_control import admin
from kdbl_core.access.principal import SCOPE_READ
from kdbl_core.logging_setup import JsonFormatter
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

FILES = {
    "pets.md": "The feline rested quietly upon the woven rug by the fireplace.",
    "gateway.md": "The API gateway returned a connection timeout while the upstream service was overloaded.",
}
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
GENERATED = re.compile(r"[0-9a-f]{32}")


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    name = f"meta-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("meta") / "kb", FILES, tenant=name)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id, batch=16) > 0
    db = db_of(owner_engine)
    token = admin.create_token(db, tenant_name=name, name="agent")[0]
    reader = admin.create_token(db, tenant_name=name, name="reader", scopes=[SCOPE_READ])[0]
    settings = Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, "token": token, "reader": reader, "tenant": name, "corpus": corpus}


class Calls:
    """The official client, and the X-Request-Id header of each tools/call response it got."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.headers: list[str | None] = []

    async def call(self, name: str, arguments: dict) -> dict:
        schema = {t.name: t for t in (await self.client.list_tools()).tools}[name].output_schema
        structured = (await self.client.call_tool(name, arguments)).structured_content
        jsonschema.validate(structured, schema)
        return structured


@asynccontextmanager
async def mcp(url: str, token: str, request_id: str | bytes | None = None):
    headers: dict = {"Authorization": f"Bearer {token}"}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    http = create_mcp_http_client(headers=headers)
    calls: Calls | None = None

    async def on_response(response) -> None:
        if b'"tools/call"' in response.request.content and calls is not None:
            calls.headers.append(response.headers.get("x-request-id"))

    http.event_hooks["response"].append(on_response)
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        calls = Calls(client)
        yield calls


def audit_of(owner_engine, request_id: str) -> list[dict]:
    with owner_engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(
            "SELECT tool, status, error FROM audit WHERE request_id = :rid"), {"rid": request_id})]


def parts_fit(took: dict[str, float]) -> bool:
    """total is at least the sum of the parts (each rounded to 1 µs)."""
    parts = [ms for part, ms in took.items() if part != "total"]
    return all(ms >= 0 for ms in parts) and took["total"] + 0.001 * len(parts) >= sum(parts)


async def test_every_tool_result_has_meta_in_its_output_schema_with_the_header_and_audit_rows_id(
        world, owner_engine):
    ref = {"source_id": str(world["corpus"].source_id), "key": "pets.md"}
    tools = {"search_content": {"query": "gateway timeout", "mode": "lexical"}, "get_file_text": ref,
             "get_file_window": ref, "get_file_metadata": ref, "list_sources": {},
             "list_files": {"source_id": ref["source_id"]}}
    async with mcp(world["url"], world["token"]) as calls:
        schemas = {t.name: t.output_schema for t in (await calls.client.list_tools()).tools}
        results = {name: await calls.call(name, args) for name, args in tools.items()}
    ids = []
    for (name, result), header in zip(results.items(), calls.headers, strict=True):
        assert "meta" in schemas[name]["required"], name
        meta = result["meta"]
        assert GENERATED.fullmatch(meta["request_id"]) and meta["request_id"] == header, (name, meta, header)
        assert meta["cache_hit"] is False
        took = meta["took_ms"]
        assert took["auth"] > 0 and took["total"] > 0 and parts_fit(took), (name, took)
        if name != "search_content":
            assert set(took) == {"auth", "db", "total"} and took["db"] > 0, (name, took)
        assert audit_of(owner_engine, meta["request_id"]) == [{"tool": name, "status": "ok", "error": None}]
        ids.append(meta["request_id"])
    assert len(set(ids)) == len(ids)  # one id per call


async def test_a_lexical_search_breaks_its_time_into_auth_keyword_and_windows(world):
    async with mcp(world["url"], world["token"]) as calls:
        # a query no other test asks (a repeated one is answered by the result cache: no keyword/windows)
        result = await calls.call("search_content", {"query": "upstream gateway timeout", "mode": "lexical"})
    took = result["meta"]["took_ms"]
    assert result["hits"] and set(took) == {"auth", "keyword", "windows", "total"}, took
    assert took["keyword"] > 0 and took["windows"] > 0 and parts_fit(took)


async def test_a_hybrid_search_adds_the_embedding_the_vector_arm_and_the_rerank(world):
    async with mcp(world["url"], world["token"]) as calls:
        result = await calls.call("search_content", {"query": "gateway timeout", "mode": "hybrid"})
    took = result["meta"]["took_ms"]
    assert result["mode"] == "hybrid" and result["degraded"] is False
    assert set(took) == {"auth", "embed", "vector", "keyword", "rerank", "windows", "total"}, took
    assert took["embed"] > 0 and took["vector"] > 0 and took["keyword"] > 0 and parts_fit(took)


async def test_a_clients_sane_request_id_is_echoed_in_header_meta_audit_row_and_log_line(
        world, owner_engine, caplog):
    caplog.set_level(logging.INFO, logger="kdbl_api.server")
    mine = f"trace-{uuid.uuid4().hex[:12]}/step 1"
    async with mcp(world["url"], world["token"], mine) as calls:
        result = await calls.call("list_sources", {})
    assert result["meta"]["request_id"] == mine and calls.headers == [mine]
    assert audit_of(owner_engine, mine) == [{"tool": "list_sources", "status": "ok", "error": None}]
    [line] = [json.loads(JsonFormatter().format(r)) for r in caplog.records
              if r.getMessage() == "mcp call" and getattr(r, "request_id", None) == mine]
    assert line["tool"] == "list_sources" and line["status"] == "ok" and line["took_ms"] > 0


async def test_an_admin_finds_one_calls_audit_row_by_the_request_id_its_client_saw(world, owner_engine):
    mine, other = (f"ticket-{uuid.uuid4().hex[:12]}" for _ in range(2))
    async with mcp(world["url"], world["token"], mine) as calls:
        await calls.call("list_sources", {})
    async with mcp(world["url"], world["token"], other) as calls:
        await calls.call("search_content", {"query": "anything else", "mode": "lexical"})
    [row] = admin.audit_rows(db_of(owner_engine), request_id=mine)
    assert row["request_id"] == mine and row["tool"] == "list_sources"
    assert [r["request_id"] for r in admin.audit_rows(db_of(owner_engine), limit=2)] == [other, mine]

@pytest.mark.parametrize("insane", ["x" * 129, "tab\there", "caf\u00e9".encode()],
                         ids=["129 characters", "a control character", "not ASCII"])
async def test_an_insane_client_request_id_is_replaced_by_a_generated_one(world, owner_engine, insane):
    async with mcp(world["url"], world["token"], insane) as calls:
        result = await calls.call("list_sources", {})
    rid = result["meta"]["request_id"]
    assert GENERATED.fullmatch(rid) and calls.headers == [rid]
    assert audit_of(owner_engine, rid) == [{"tool": "list_sources", "status": "ok", "error": None}]


def test_sane_ids_are_printable_ascii_of_at_most_128_characters():
    assert sane_id("a" * 128) == "a" * 128 and sane_id("req 1/2:x") == "req 1/2:x"
    assert sane_id("a" * 129) is None and sane_id("") is None and sane_id("   ") is None
    assert sane_id("line\nbreak") is None and sane_id("\u00e9") is None and sane_id(None) is None
    assert GENERATED.fullmatch(CallMeta.begin("\x00").request_id)


async def test_a_bad_argument_answers_minus_32602_with_the_header_and_an_audited_id(world, owner_engine):
    async with mcp(world["url"], world["token"], "bad-arg-1") as calls:
        with pytest.raises(MCPError) as err:
            await calls.client.call_tool("search_content", {"query": "x", "limit": 0})
    assert err.value.code == -32602 and calls.headers == ["bad-arg-1"]
    [row] = audit_of(owner_engine, "bad-arg-1")
    assert row["tool"] == "search_content" and row["status"] == "error" and "limit" in row["error"]


async def post(url: str, token: str, body: dict, request_id: str | None = None) -> httpx.Response:
    headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
    if request_id is not None:
        headers["X-Request-Id"] = request_id
    async with httpx.AsyncClient() as http:
        return await http.post(f"{url}/mcp", json=body, headers=headers)


LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
SEARCH = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
          "params": {"name": "search_content", "arguments": {"query": "gateway"}}}


async def test_refusals_at_the_front_door_carry_the_header_and_an_audit_row_with_the_id(world, owner_engine):
    # 401: a revoked token of the tenant (audited) and a token nobody issued (no tenant to audit for)
    revoked = admin.create_token(db_of(owner_engine), tenant_name=world["tenant"], name="gone")[0]
    admin.revoke_token(db_of(owner_engine), revoked)
    refused = await post(world["url"], revoked, LIST, "revoked-1")
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "revoked-1"
    assert audit_of(owner_engine, "revoked-1") == [
        {"tool": "mcp", "status": "unauthenticated", "error": refused.json()["error"]["message"]}]
    unknown = await post(world["url"], "not-a-token", LIST)
    assert unknown.status_code == 401 and GENERATED.fullmatch(unknown.headers["x-request-id"])
    # 403: a read-only token calling search
    denied = await post(world["url"], world["reader"], SEARCH)
    rid = denied.headers["x-request-id"]
    assert denied.status_code == 403 and GENERATED.fullmatch(rid)
    [row] = audit_of(owner_engine, rid)
    assert row["tool"] == "search_content" and row["status"] == "denied"


async def test_a_rate_limited_call_carries_the_header_and_an_audit_row_with_the_id(
        owner_engine, owner_url):
    name = f"meta-rl-{uuid.uuid4().hex[:8]}"
    db = db_of(owner_engine)
    admin.create_tenant(db, name)
    admin.update_tenant(db, name, rate_limit="1/m")
    token = admin.create_token(db, tenant_name=name, name="agent")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        first = await post(url, token, LIST)
        limited = await post(url, token, LIST, "limited-1")
    assert first.status_code == 200 and GENERATED.fullmatch(first.headers["x-request-id"])
    assert limited.status_code == 429 and limited.headers["x-request-id"] == "limited-1"
    [row] = audit_of(owner_engine, "limited-1")
    assert row["tool"] == "tools/list" and row["status"] == "rate_limited"
