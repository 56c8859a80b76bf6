"""kdbl_api.front_door.envelope in process: the body read within its size and time limits (413, 408: not
audited), one JSON-RPC message parsed once (400 naming the field, audited as `error` with the request's tool),
and what passes on the call: its body, message and calls."""

from __future__ import annotations

import json
from typing import Any

import anyio
from front_door_doubles import (
    SETTINGS, Downstream, RecordingRefusals, drive, opened, principal, reading, rpc, tool_call,
)

from kdbl_api.front_door.envelope import ReadEnvelope, calls_of

ADA = principal()


def _part(settings=SETTINGS) -> tuple[Any, Downstream, RecordingRefusals]:
    refusals, nxt = RecordingRefusals(), Downstream()
    return reading(ReadEnvelope(nxt, settings, refusals)), nxt, refusals


async def test_a_message_in_chunks_is_read_whole_parsed_once_and_its_call_named():
    part, nxt, refusals = _part()
    message = tool_call("search_content", {"query": "okapi"})
    body = json.dumps(message).encode()
    scope, call = opened(ADA)
    answer = await drive(part, scope, [body[:10], body[10:20], body[20:]])
    assert answer.status == 200 and refusals.rows == []
    assert call.body == body and call.message == message
    assert call.calls == [("tools/call", "search_content", {"query": "okapi"})]


def test_the_calls_of_a_message_name_a_tools_tool_and_keep_a_resources_params():
    assert calls_of(rpc("resources/read", {"uri": "kdbl://file/s/a.md"})) == [
        ("resources/read", "resources/read", {"uri": "kdbl://file/s/a.md"})]
    assert calls_of(rpc("tools/list", {"cursor": "c"})) == [("tools/list", "tools/list", {})]
    assert calls_of(rpc("notifications/initialized", request_id=None)) == []
    assert calls_of({"jsonrpc": "2.0", "id": 1, "result": {}}) == []
    assert calls_of(tool_call("get_file_text", None)) == [("tools/call", "get_file_text", {})]


async def test_a_notification_passes_with_no_calls():
    part, nxt, _ = _part()
    scope, call = opened(ADA)
    assert (await drive(part, scope, json.dumps(rpc("notifications/initialized", request_id=None)).encode())
            ).status == 200
    assert call.calls == [] and call.message["method"] == "notifications/initialized"


async def test_a_body_over_the_limit_is_413_whether_declared_or_counted_and_not_audited():
    part, nxt, refusals = _part()
    big = b"x" * 5000
    scope, _ = opened(ADA, headers={"Content-Length": "5000"})
    declared = await drive(part, scope, big)
    scope, _ = opened(ADA)
    counted = await drive(part, scope, [big[:3000], big[3000:]])
    for answer in (declared, counted):
        assert answer.status == 413 and answer.json()["error"]["message"] == "request body exceeds 4096 bytes"
    assert nxt.reached == [] and refusals.rows == []


async def test_a_body_that_stalls_is_408_with_connection_close():
    part, nxt, refusals = _part(SETTINGS.model_copy(update={"body_read_timeout_s": 0.05}))
    scope, _ = opened(ADA)
    never = anyio.Event()
    sent: list[dict] = []

    async def receive():
        if not sent:
            sent.append({})
            return {"type": "http.request", "body": b'{"jsonrpc"', "more_body": True}
        await never.wait()

    async def send(message):
        sent.append(message)

    with anyio.fail_after(5):
        await part(scope, receive, send)
    start = sent[1]
    assert start["status"] == 408 and (b"connection", b"close") in start["headers"]
    assert json.loads(sent[2]["body"])["error"]["message"] == "request body not received within 0.05 s"
    assert nxt.reached == [] and refusals.rows == []


async def test_a_body_that_is_not_json_is_400_parse_error_audited_without_a_tool():
    part, nxt, refusals = _part()
    scope, _ = opened(ADA)
    answer = await drive(part, scope, b"{not json")
    body = answer.json()
    assert answer.status == 400 and body["id"] is None and body["error"]["code"] == -32700
    [row] = refusals.rows
    assert (row["tool"], row["status"], row["tenant_id"]) == ("mcp", "error", ADA.tenant_id)
    assert row["error"] == body["error"]["message"] and nxt.reached == []


async def test_a_bad_envelope_echoes_a_usable_id_names_the_field_and_audits_the_requests_tool():
    part, nxt, refusals = _part()
    scope, _ = opened(ADA)
    message = {**tool_call("search_content", {"query": "q"}), "jsonrpc": "1.0", "id": 9}
    answer = await drive(part, scope, json.dumps(message).encode())
    assert answer.status == 400 and answer.json()["id"] == 9
    assert answer.json()["error"]["data"] == {"field": "jsonrpc"}
    [row] = refusals.rows
    assert (row["tool"], row["arguments"], row["status"]) == ("search_content", {"query": "q"}, "error")


async def test_a_batch_is_refused_and_audited_with_its_first_requests_tool():
    part, nxt, refusals = _part()
    scope, _ = opened(ADA)
    batch = [tool_call("get_file_text", {"key": "a"}), rpc("ping")]
    answer = await drive(part, scope, json.dumps(batch).encode())
    assert answer.status == 400 and "no batches" in answer.json()["error"]["message"]
    assert [r["tool"] for r in refusals.rows] == ["get_file_text"] and nxt.reached == []
