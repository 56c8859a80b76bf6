"""The `answer` tool through the official MCP client, against the real API and a tiny chat model the test
builds (tests/chat_model.py): the allowlist, extractive citations with exact ranges, tenant and per-file
grant isolation, max_tokens, the timeout, progress notifications, cancellation, and no model."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import anyio
import httpx
import jsonschema
import pytest
from chat_model import build_chat_model
from helpers import db_of, make_corpus, mcp_client, serving, window_chunk_texts
from mcp.client import Client
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.chat import ChatModel
from kdbl_core.db.urls import for_role
from kdbl_core.search.answer import NOT_FOUND
from kdbl_core.settings import Settings

SIX = ["search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files"]
FILES = {
    "vitamin.md": ("# Vitamin D\n\nVitamin D deficiency raises the risk of fractures in elderly patients. "
                   "The trial enrolled 400 volunteers in Oslo.\n\nSunlight exposure lets the skin synthesise "
                   "vitamin D within minutes."),
    "heliostat.md": ("Heliostat mirrors track the sun with two motors. A heliostat field of 9000 mirrors feeds "
                     "the central receiver tower."),
    "garden.md": "Tomatoes need full sun, regular watering and support stakes.",
}
SECRET = {"zebrafin.md": "The zebrafin protocol encrypts quarterly payroll exports with rotating keys."}


@pytest.fixture(scope="session")
def chat_model(tmp_path_factory):
    """The tiny chat model, built once per session under tmp and loaded once."""
    model = ChatModel(build_chat_model(tmp_path_factory.mktemp("chat") / "tiny-chat.gguf"), n_ctx=8192)
    yield model
    model.close()


@contextmanager
def api(owner_url, chat: ChatModel | None, **settings):
    from kdbl_api.app import create_app

    app = create_app(Settings(mcp_enabled=True, **settings), for_role(owner_url, "kdbl_api"), chat=chat)
    with serving(app, proxy_headers=False) as url:
        yield url


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, chat_model):
    root = tmp_path_factory.mktemp("answer")
    name = f"answer-{uuid.uuid4().hex[:8]}"
    corpus = make_corpus(owner_engine, worker_engine, root / "kb", FILES, tenant=name)
    admin.update_tenant(db_of(owner_engine), name, tools=",".join(SIX + ["answer"]))
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    plain = f"plain-{uuid.uuid4().hex[:8]}"
    make_corpus(owner_engine, worker_engine, root / "plain", FILES, tenant=plain)
    plain_token = admin.create_token(db_of(owner_engine), tenant_name=plain, name="agent")[0]
    other = f"other-{uuid.uuid4().hex[:8]}"
    make_corpus(owner_engine, worker_engine, root / "other", SECRET, tenant=other)
    admin.update_tenant(db_of(owner_engine), other, tools=",".join(SIX + ["answer"]))
    with api(owner_url, chat_model, chat_timeout_s=120.0, chat_ctx=8192) as url:
        yield {"url": url, "token": token, "plain_token": plain_token, "corpus": corpus, "tenant": name}


mcp = mcp_client


async def ask(url: str, token: str, progress=None, **args) -> dict:
    async with mcp(url, token) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["answer"].output_schema
        result = await client.call_tool("answer", args, progress_callback=progress)
    assert not result.is_error, result.content
    jsonschema.validate(result.structured_content, schema)
    return result.structured_content


async def file_text(client: Client, source_id: str, key: str) -> str:
    """The file's extracted text, rebuilt from get_file_text's chunks at their char offsets."""
    body = (await client.call_tool("get_file_text", {"source_id": source_id, "key": key})).structured_content
    text = [" "] * max(c["char_end"] for c in body["chunks"])
    for c in body["chunks"]:
        text[c["char_start"]:c["char_end"]] = c["text"]
    return "".join(text)


async def test_answer_is_listed_and_callable_only_where_the_tenants_allowlist_names_it(world):
    async with mcp(world["url"], world["plain_token"]) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        with pytest.raises(MCPError) as refused:
            await client.call_tool("answer", {"question": "vitamin D fractures"})
    assert "answer" not in names and set(SIX) <= set(names)
    assert refused.value.code == -32602 and "unknown tool 'answer'" in refused.value.message
    async with mcp(world["url"], world["token"]) as client:
        tool = {t.name: t for t in (await client.list_tools()).tools}["answer"]
    assert tool.input_schema["properties"]["answer_type"]["default"] == "extractive"
    assert set(tool.input_schema["properties"]["answer_type"]["enum"]) == {"extractive", "abstractive"}
    assert "source_ids" in tool.input_schema["properties"]  # search_content's filters
    assert {"answer", "citations", "found", "meta"} <= set(tool.output_schema["required"])


async def test_an_extractive_answer_cites_sentences_whose_char_ranges_slice_the_file_text_exactly(world):
    result = await ask(world["url"], world["token"], question="Does vitamin D deficiency raise fracture risk?")
    assert result["found"] is True and result["answer_type"] == "extractive" and result["model"] is None
    first = result["citations"][0]
    assert first["key"] == "vitamin.md" and "fractures" in first["text"] and first["n"] == 1
    assert result["answer"].startswith(first["text"] + " [1]")
    async with mcp(world["url"], world["token"]) as client:
        for citation in result["citations"]:
            text = await file_text(client, citation["source_id"], citation["key"])
            assert text[citation["char_start"]:citation["char_end"]] == citation["text"]
            assert citation["uri"] == f"kdbl://file/{citation['source_id']}/{citation['key']}"
            assert citation["chunk_uri"] == f"kdbl://chunk/{citation['chunk_id']}"
            window = (await client.call_tool("get_file_window", {
                "source_id": citation["source_id"], "key": citation["key"], "start": citation["seq"],
                "length": 1})).structured_content
            assert citation["text"] in window_chunk_texts(window)[0]


async def test_an_answer_is_audited_and_links_each_cited_file(world, owner_engine):
    async with mcp(world["url"], world["token"]) as client:
        result = await client.call_tool("answer", {"question": "heliostat mirrors track the sun"})
    links = [b for b in result.content if b.type == "resource_link"]
    assert [str(b.uri) for b in links] == list(dict.fromkeys(c["uri"] for c in result.structured_content["citations"]))
    [row] = admin.audit_rows(db_of(owner_engine), tool="answer", tenant_name=world["tenant"],
                             request_id=result.structured_content["meta"]["request_id"])
    assert row["status"] == "ok" and "heliostat.md" in str(row)


async def test_a_lexical_only_tenant_gets_extractive_answers(owner_engine, worker_engine, world, tmp_path):
    name = f"lexical-{uuid.uuid4().hex[:8]}"
    make_corpus(owner_engine, worker_engine, tmp_path / "kb", FILES, tenant=name)
    admin.update_tenant(db_of(owner_engine), name, tools=",".join(SIX + ["answer"]), modes="lexical")
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    result = await ask(world["url"], token, question="tomatoes need full sun and watering")
    assert result["mode"] == "lexical" and result["found"] is True
    assert result["citations"][0]["text"] == "Tomatoes need full sun, regular watering and support stakes."


async def test_extractive_answers_without_citations_have_no_markers(world):
    result = await ask(world["url"], world["token"], question="heliostat mirrors motors", citations=False)
    assert result["found"] is True and result["citations"] == [] and "[1]" not in result["answer"]
    assert "Heliostat mirrors track the sun with two motors." in result["answer"]


async def test_a_question_nothing_answers_is_not_found_with_no_citation(world):
    result = await ask(world["url"], world["token"], question="quarterly payroll encryption zebrafin protocol")
    assert result == {**result, "answer": NOT_FOUND, "found": False, "citations": []}


async def test_a_question_only_another_tenants_file_answers_finds_nothing_of_it(world):
    for answer_type in ("extractive", "abstractive"):
        result = await ask(world["url"], world["token"], question="zebrafin protocol payroll exports",
                           answer_type=answer_type)
        assert result["found"] is False and result["citations"] == [] and result["answer"] == NOT_FOUND
        assert "zebrafin" not in str(result["citations"])


async def test_a_file_outside_the_callers_per_file_grant_answers_nothing(owner_engine, worker_engine, world,
                                                                         tmp_path):
    name = f"grants-{uuid.uuid4().hex[:8]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "kb",
                         {"open.md": "The cafeteria opens at eight.", **SECRET}, tenant=name, restricted=True)
    admin.update_tenant(db_of(owner_engine), name, tools=",".join(SIX + ["answer"]))
    admin.add_grant(db_of(owner_engine), source_id=corpus.source_id, subject="user:alice", file_key="open.md")
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="alice", subject="user:alice")[0]
    secret = await ask(world["url"], token, question="zebrafin protocol payroll exports")
    granted = await ask(world["url"], token, question="when does the cafeteria open")
    assert secret["found"] is False and secret["citations"] == []
    assert granted["found"] is True and [c["key"] for c in granted["citations"]] == ["open.md"]


async def test_max_tokens_bounds_the_answer_and_a_cut_sentence_keeps_an_exact_range(world):
    result = await ask(world["url"], world["token"], question="heliostat field mirrors central receiver tower",
                       max_tokens=16)
    assert result["tokens"] <= 16 and len(result["citations"]) == 1
    async with mcp(world["url"], world["token"]) as client:
        c = result["citations"][0]
        text = await file_text(client, c["source_id"], c["key"])
    assert text[c["char_start"]:c["char_end"]] == c["text"]
    abstractive = await ask(world["url"], world["token"], question="heliostat mirrors", answer_type="abstractive",
                            max_tokens=24)
    assert abstractive["tokens"] == 24 and abstractive["finish_reason"] == "length"  # the noise model never stops
    assert abstractive["model"] == "tiny-chat.gguf"


@pytest.mark.parametrize(("args", "field"), [
    ({"question": "x", "max_tokens": 15}, "max_tokens"),
    ({"question": "x", "max_tokens": 4097}, "max_tokens"),
    ({"question": "x", "answer_type": "generative"}, "answer_type"),
    ({"question": "   "}, "question"),
    ({"question": "x", "citations": "yes"}, "citations"),
    ({"question": "x", "source_ids": ["not-a-uuid"]}, "source_ids.0"),
])
async def test_bad_arguments_are_refused_naming_the_field(world, args, field):
    async with mcp(world["url"], world["token"]) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("answer", args)
    assert refused.value.code == -32602 and refused.value.error.data["field"] == field


async def test_abstractive_progress_notifications_carry_the_answer_in_order_then_the_result(world):
    deltas: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        deltas.append((value, total, message))

    result = await ask(world["url"], world["token"], progress, question="vitamin D sunlight skin",
                       answer_type="abstractive", max_tokens=32)
    assert len(deltas) == 32 and [d[0] for d in deltas] == list(range(1, 33)) and deltas[0][1] == 32
    assert "".join(d[2] for d in deltas).strip() == result["answer"]
    cited = {int(n) for n in __import__("re").findall(r"\[(\d)\]", result["answer"])}
    assert {c["n"] for c in result["citations"]} <= cited  # only passages the answer cites
    for c in result["citations"]:
        assert c["key"] in FILES and len(c["text"]) == c["char_end"] - c["char_start"]


async def test_extractive_progress_sends_each_sentence_and_other_calls_stay_one_json_body(world):
    deltas: list[str] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        deltas.append(message)

    result = await ask(world["url"], world["token"], progress, question="vitamin D deficiency fractures sunlight")
    assert len(deltas) == len(result["citations"]) >= 2 and "".join(deltas) == result["answer"]
    async with httpx.AsyncClient() as http:
        plain = await http.post(f"{world['url']}/mcp", headers={
            "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"}, json={
            "jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "answer", "arguments": {"question": "heliostat motors"}}})
        search = await http.post(f"{world['url']}/mcp", headers={
            "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-11-25"}, json={
            "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "search_content", "_meta": {"progressToken": 5}, "arguments": {"query": "heliostat"}}})
    assert plain.headers["content-type"].startswith("application/json")
    assert plain.json()["result"]["structuredContent"]["found"] is True
    assert search.headers["content-type"].startswith("application/json")  # a tool that does not stream
    assert search.json()["result"]["structuredContent"]["hits"][0]["key"] == "heliostat.md"


async def test_a_generation_past_the_timeout_stops_with_the_text_so_far(world, owner_url, chat_model):
    with api(owner_url, chat_model, chat_timeout_s=0.3, chat_ctx=8192) as url:
        result = await ask(url, world["token"], question="vitamin D sunlight", answer_type="abstractive",
                           max_tokens=4096)
    assert result["finish_reason"] == "timeout" and 0 < result["tokens"] < 4096
    assert chat_model.last.finish_reason == "timeout"  # the generation itself stopped, not only the reply


async def test_cancelling_the_call_stops_generation_between_tokens(world, chat_model):
    seen = anyio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.set()

    async with mcp(world["url"], world["token"]) as client:
        with anyio.move_on_after(60):
            async with anyio.create_task_group() as tg:
                async def call() -> None:
                    await client.call_tool("answer", {"question": "vitamin D sunlight", "answer_type": "abstractive",
                                                      "max_tokens": 4096}, progress_callback=progress)

                tg.start_soon(call)
                await seen.wait()
                tg.cancel_scope.cancel()
    assert await anyio.to_thread.run_sync(chat_model.idle, 30)
    assert chat_model.last.finish_reason == "cancelled" and chat_model.last.tokens < 4096
    assert chat_model.last.tokens_after_stop <= 1


async def test_the_http_client_going_away_stops_generation(world, chat_model):
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "answer", "_meta": {"progressToken": "p"},
        "arguments": {"question": "vitamin D sunlight", "answer_type": "abstractive", "max_tokens": 4096}}}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{world['url']}/mcp", json=body, headers={
                "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
                "MCP-Protocol-Version": "2025-11-25"}) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            async for line in response.aiter_lines():
                if "notifications/progress" in line:
                    break  # and close the connection
    assert await anyio.to_thread.run_sync(chat_model.idle, 30)
    assert chat_model.last.finish_reason == "cancelled" and chat_model.last.tokens < 4096


async def test_without_a_chat_model_abstractive_is_hidden_and_refused_but_extractive_is_listed_and_answers(
        world, owner_url):
    with api(owner_url, None) as url:
        async with mcp(url, world["token"]) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            with pytest.raises(MCPError) as refused:
                await client.call_tool("answer", {"question": "vitamin D", "answer_type": "abstractive"})
            extractive = (await client.call_tool("answer", {"question": "vitamin D fractures"})).structured_content
    assert listed["answer"].input_schema["properties"]["answer_type"]["enum"] == ["extractive"]
    assert "no chat model" in listed["answer"].description
    assert refused.value.code == -32602 and refused.value.error.data["field"] == "answer_type"
    assert "KDBL_CHAT_MODEL_PATH" in refused.value.message
    assert extractive["found"] is True and extractive["citations"][0]["key"] == "vitamin.md"


async def test_capacity_reports_the_answer_latency_for_a_tenant_that_may_call_it(world):
    await ask(world["url"], world["token"], question="tomatoes sun watering")
    async with httpx.AsyncClient() as http:
        allowed = (await http.get(f"{world['url']}/capacity",
                                  headers={"Authorization": f"Bearer {world['token']}"})).json()
        plain = (await http.get(f"{world['url']}/capacity",
                                headers={"Authorization": f"Bearer {world['plain_token']}"})).json()
    assert "tools" not in plain
    answer = allowed["tools"]["answer"]
    assert answer["extractive"]["latency"]["samples"] >= 1 and answer["abstractive"]["available"] is True
    assert answer["abstractive"]["model"] == "tiny-chat.gguf"
