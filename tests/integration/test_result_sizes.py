"""Lean results (issue 28), on the wire: each text once per result and once per response where the client
says what it reads, get_file_window within an agent's budget, gzip for large answers a client accepts (never
for an event stream), a trimmed tools/list — and no client loses information on the way."""

from __future__ import annotations

import json
import uuid

import httpx
import jsonschema
import pytest
from helpers import db_of, make_corpus, mcp_client, running_api, window_chunk_texts

from kdbl_control import admin
from kdbl_core.settings import Settings

SIX = ["search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files"]
# paragraphs of ~1,000 characters: the chunker puts one or two in a chunk
LONG = "\n\n".join(f"Part {i} of the heliostat manual. " + ("Mirror cleaning keeps the field efficient. " * 22)
                   for i in range(150))
FILES = {"manual.txt": LONG, "note.md": "# Heliostat note\n\nThe heliostat tracks the sun from dawn to dusk.",
         **{f"log-{i}.md": f"Heliostat inspection log {i}: mirrors cleaned, tracking checked." for i in range(8)}}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"sizes-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("sizes") / "kb", FILES, tenant=name)
    admin.update_tenant(db_of(owner_engine), name, tools=",".join(SIX + ["get_contents", "answer"]), force=True)
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    with running_api(owner_url, Settings(mcp_enabled=True, rate_limit_per_minute=0)) as url:
        yield {"url": url, "token": token, "sid": str(corpus.source_id)}


def post(world, method: str, params: dict | None = None, *, version: str = "2025-11-25", encoding: str = "identity",
         **headers: str) -> httpx.Response:
    """One JSON-RPC request as a plain HTTP client sends it; `headers` as keyword arguments (x_kdbl_text_block=...)."""
    sent = {"Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
            "Accept-Encoding": encoding, **({"MCP-Protocol-Version": version} if version else {}),
            **{k.replace("_", "-"): v for k, v in headers.items()}}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, **({"params": params} if params is not None else {})}
    return httpx.post(f"{world['url']}/mcp", json=body, headers=sent, timeout=60)


def call(world, tool: str, arguments: dict, **kw) -> tuple[dict, httpx.Response]:
    response = post(world, "tools/call", {"name": tool, "arguments": arguments}, **kw)
    assert response.status_code == 200, response.text
    return response.json()["result"], response


def schemas(world) -> dict[str, dict]:
    return {t["name"]: t for t in post(world, "tools/list").json()["result"]["tools"]}


def unmeta(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "meta"}


def keys_named(name: str, node) -> list:
    if isinstance(node, dict):
        return [k for k in node if k == name] + [x for v in node.values() for x in keys_named(name, v)]
    return [x for v in node for x in keys_named(name, v)] if isinstance(node, list) else []


def window_ref(world, **more) -> dict:
    return {"source_id": world["sid"], "key": "manual.txt", **more}


def test_a_default_window_holds_16000_characters_at_most_each_once_in_the_result(world):
    result, response = call(world, "get_file_window", window_ref(world))
    body = result["structuredContent"]
    text = len(body["text"])
    assert body["window"]["chars"] == text <= 16_000 and body["has_more"]
    assert all("text" not in c for c in body["chunks"]) and window_chunk_texts(body)[0] in body["text"]
    assert json.loads(result["content"][0]["text"]) == body  # the text block: the same result, for text readers
    # each text once in the result, twice in the response (one copy for each kind of client): 214 KB for 48 KB
    # of text before, the text four times
    assert len(response.content) < 2.5 * text


def test_a_client_that_reads_structured_content_gets_each_text_once_per_response_when_it_asks(world):
    result, response = call(world, "get_file_window", window_ref(world), x_kdbl_text_block="summary")
    body = result["structuredContent"]
    text = len(body["text"])
    summary = json.loads(result["content"][0]["text"])
    assert summary["chunks"] == len(body["chunks"]) and summary["next_cursor"] == body["next_cursor"]
    assert len(result["content"][0]["text"]) < 1_500 and len(response.content) < 1.3 * text
    whole, response = call(world, "get_file_text", {"source_id": world["sid"], "key": "manual.txt"},
                           x_kdbl_text_block="summary")
    assert [c["type"] for c in whole["content"]] == ["text"]  # no embedded resource: the chunks hold the text
    assert len(response.content) < 1.3 * sum(len(c["text"]) for c in whole["structuredContent"]["chunks"])
    found, _ = call(world, "search_content", {"query": "heliostat", "mode": "lexical", "limit": 5},
                    x_kdbl_text_block="summary")
    hits = found["structuredContent"]["hits"]
    assert json.loads(found["content"][0]["text"])["hits"] == len(hits) == 5
    assert {c["uri"] for c in found["content"][1:]} == {h["uri"] for h in hits}  # the citations stay


def test_a_client_of_a_protocol_before_2025_06_18_gets_the_result_as_text_alone(world):
    listed = post(world, "tools/list", version="2025-03-26").json()["result"]["tools"]
    assert listed and all("outputSchema" not in t for t in listed)
    for version in ("2025-03-26", "2024-11-05"):
        result, response = call(world, "get_file_window", window_ref(world), version=version)
        assert "structuredContent" not in result
        body = json.loads(result["content"][0]["text"])  # all of it, each text once
        jsonschema.validate(body, schemas(world)["get_file_window"]["outputSchema"])
        assert len(response.content) < 1.25 * len(body["text"])  # each text once, plus locators and escapes
    whole, _ = call(world, "get_file_text", {"source_id": world["sid"], "key": "note.md"}, version="2025-03-26")
    assert "structuredContent" not in whole and whole["content"][1]["resource"]["text"].startswith("# Heliostat")
    # a request without MCP-Protocol-Version (curl, scripts) gets both: more bytes, never less information
    result, _ = call(world, "get_file_window", window_ref(world), version="")
    assert result["structuredContent"] == json.loads(result["content"][0]["text"])


def test_large_answers_are_gzipped_for_clients_that_accept_it_and_small_ones_are_not(world):
    plain = call(world, "get_file_text", {"source_id": world["sid"], "key": "manual.txt"})[1]
    packed = call(world, "get_file_text", {"source_id": world["sid"], "key": "manual.txt"}, encoding="gzip")[1]
    assert "content-encoding" not in plain.headers and packed.headers["content-encoding"] == "gzip"
    assert packed.num_bytes_downloaded < plain.num_bytes_downloaded / 5  # (a repetitive manual)
    assert unmeta(packed.json()["result"]["structuredContent"]) == unmeta(plain.json()["result"]["structuredContent"])
    assert packed.headers["x-request-id"] and "accept-encoding" in packed.headers["vary"].lower()
    small = call(world, "get_file_metadata", {"source_id": world["sid"], "key": "note.md"}, encoding="gzip")[1]
    assert "content-encoding" not in small.headers  # under 4 KiB: not worth a compressor


async def test_a_streamed_answer_is_never_gzipped_or_buffered(world):
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "answer", "_meta": {"progressToken": "p"}, "arguments": {"question": "heliostat mirrors cleaned"}}}
    events = []
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{world['url']}/mcp", json=body, headers={
                "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
                "Accept-Encoding": "gzip", "MCP-Protocol-Version": "2025-11-25"}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            assert "content-encoding" not in response.headers
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    events.append(json.loads(line[5:]))
    assert events[0]["method"] == "notifications/progress" and "result" in events[-1]


def test_tools_list_stays_over_a_quarter_smaller_and_keeps_what_agents_read(world):
    raw = post(world, "tools/list")
    tools = raw.json()["result"]["tools"]
    six = [t for t in tools if t["name"] in SIX]
    size = len(json.dumps({"tools": six}, separators=(",", ":")))
    # 25,400 before the trim (the six tools' definitions, compact JSON); 17,077 after it; 18,135 with search mode
    # graph and the typed per-hit rationale (issue 31: +830 bytes of output schema, +220 of descriptions)
    assert size < 18_300
    for tool in tools:  # every argument described; results still typed for clients that validate them
        assert tool["description"] and all(p.get("description") for p in tool["inputSchema"]["properties"].values())
        assert tool["outputSchema"]["type"] == "object" and tool["outputSchema"]["required"]
        assert not keys_named("title", tool["inputSchema"]) and '"default":null' not in raw.text


async def test_the_official_client_reads_every_trimmed_result_against_its_trimmed_schema(world):
    """The SDK client validates structuredContent against outputSchema: nullable fields must stay nullable."""
    async with mcp_client(world["url"], world["token"]) as client:
        found = (await client.call_tool("search_content", {"query": "heliostat", "limit": 5})).structured_content
        hit = found["hits"][0]
        assert hit["page_no"] is None and hit["url"] is None  # nulls the trimmed schema still allows
        await client.call_tool("get_file_metadata", {"source_id": world["sid"], "key": "note.md"})
        await client.call_tool("list_sources", {})
        await client.call_tool("get_contents", {"ids": [f"kdbl://file/{world['sid']}/note.md"]})
        window = (await client.call_tool("get_file_window", window_ref(world, length=3))).structured_content
    assert [c["seq"] for c in window["chunks"]] == [0, 1, 2]

