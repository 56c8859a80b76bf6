"""kdbl_api.front_door.opening in process: the call opened on the scope, its request id on every answer, 404
while MCP is off and 405 for anything but POST, before any token is read."""

from __future__ import annotations

import re

from front_door_doubles import SETTINGS, Downstream, drive, scope_of

from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.opening import OpenCall
from kdbl_api.request_meta import CallMeta


async def test_a_post_reaches_the_next_part_with_its_call_open_and_the_clients_request_id_answered():
    nxt = Downstream()
    answer = await drive(OpenCall(nxt, SETTINGS), scope_of(headers={"X-Request-Id": "trace-42"}), b"{}")
    assert answer.status == 200 and answer.header("x-request-id") == "trace-42"
    call = nxt.call
    assert isinstance(call, Call) and call.meta.request_id == "trace-42" and not call.json_only
    assert call.started >= call.meta.started and call.access is None and call.policy is None
    assert nxt.bodies == [b"{}"]  # the body is left for the parts that read it


async def test_the_call_lets_go_of_its_request_once_answered_and_the_request_was_the_calls_own():
    seen = []

    async def nxt(scope, receive, send):
        seen.append(scope[KEY].request)
        await Downstream()(scope, receive, send)

    scope = scope_of(headers={"Authorization": "Bearer x"})
    await drive(OpenCall(nxt, SETTINGS), scope)
    assert seen[0].scope is scope and seen[0].headers["authorization"] == "Bearer x"
    assert scope[KEY].request is None  # no scope -> call -> request -> scope cycle outlives the call


async def test_a_request_id_that_may_not_travel_is_replaced_by_a_fresh_one():
    nxt = Downstream()
    answer = await drive(OpenCall(nxt, SETTINGS), scope_of(headers={"X-Request-Id": "x" * 129}))
    assert re.fullmatch(r"[0-9a-f]{32}", answer.header("x-request-id"))
    assert nxt.call.meta.request_id == answer.header("x-request-id")


async def test_mcp_switched_off_answers_404_with_the_request_id_and_goes_no_further():
    nxt = Downstream()
    off = SETTINGS.model_copy(update={"mcp_enabled": False})
    answer = await drive(OpenCall(nxt, off), scope_of(headers={"X-Request-Id": "r1"}))
    assert answer.status == 404 and answer.header("x-request-id") == "r1"
    assert answer.json() == {"error": "MCP is disabled on this server (KDBL_MCP_ENABLED=false)"}
    assert nxt.reached == []


async def test_anything_but_post_answers_405_naming_post_and_goes_no_further():
    nxt = Downstream()
    for method in ("GET", "DELETE", "PUT"):
        answer = await drive(OpenCall(nxt, SETTINGS), scope_of(method=method, headers={"X-Request-Id": "r2"}))
        assert answer.status == 405 and answer.header("allow") == "POST"
        assert answer.header("x-request-id") == "r2"
        assert answer.body == b"Method Not Allowed: this MCP endpoint is POST-only (no SSE stream)"
    assert nxt.reached == []


async def test_an_in_process_caller_that_reads_json_only_keeps_that_wish_in_a_fresh_call():
    nxt = Downstream()
    asked = Call(CallMeta(request_id="placeholder"), json_only=True)
    await drive(OpenCall(nxt, SETTINGS), scope_of(headers={"X-Request-Id": "sse-7"}, call=asked))
    assert nxt.call is not asked and nxt.call.json_only and nxt.call.meta.request_id == "sse-7"
