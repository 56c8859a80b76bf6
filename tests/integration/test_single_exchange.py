"""kdbl_api.front_door.single_exchange over real HTTP: the requests it takes are answered as the MCP SDK's
stateless JSON transport answers them (status, content type, JSON-RPC body), and everything it does not answer
exactly so still reaches the SDK's transport."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from helpers import db_of, make_corpus, serving

from kdbl_api.app import create_app
from kdbl_api.front_door.single_exchange import _result_body
from kdbl_control import admin
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings

HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25",
           "Content-Type": "application/json"}


def rpc(method: str, params: dict[str, Any] | None = None, rid: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, **({"params": params} if params is not None else {})}


def tool(name: str, arguments: dict[str, Any], rid: Any = 1) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments}, rid)


@pytest.fixture(scope="module")
def served(owner_url, owner_engine, worker_engine, tmp_path_factory):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("single") / "docs", {
        "okapi.md": "# Okapi\n\nThe okapi census is due in March; okapis live in the Ituri forest.",
        "notes/travel.md": "Travel policy: economy class for flights under six hours.",
    }, tenant="single-exchange")
    token = admin.create_token(db_of(owner_engine), tenant_name="single-exchange", name="agent")[0]
    settings = Settings(mcp_enabled=True, rate_limit_per_minute=0, search_cache_bytes=0)  # each call its own search
    app = create_app(settings, for_role(owner_url, "kdbl_api"))
    with serving(app, proxy_headers=False) as url:
        yield {"app": app, "url": url, "token": token, "source": str(corpus.source_id)}


class Counted:
    """The app's single exchange with its answers counted (the dispatch part's own object, wrapped)."""

    def __init__(self, app) -> None:
        self.dispatch = app.state.kdbl.front_door.dispatch
        self.single = self.dispatch.single
        self.taken = 0
        answer = self.single.answer

        async def counted(*args, **kwargs):
            self.taken += 1
            return await answer(*args, **kwargs)

        self.single.answer = counted

    def through_the_sdk(self, on: bool) -> None:
        self.dispatch.single = None if on else self.single


def post(served, message: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{served['url']}/mcp", content=json.dumps(message),
                      headers={**HEADERS, "Authorization": f"Bearer {served['token']}", **(headers or {})},
                      timeout=60)


def comparable(value: Any) -> Any:
    """A JSON-RPC answer without what differs from call to call (request id, timings), JSON text read too."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in ("request_id", "took_ms")}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, str) and value.startswith("{"):
        try:
            return comparable(json.loads(value))
        except ValueError:
            return value
    return value


def differences(a: Any, b: Any, at: str = "") -> list[str]:
    """Where two JSON values differ (paths), for a failure's message."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in differences(a.get(k), b.get(k), f"{at}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{at}[{i}]")]
    return [] if a == b else [f"{at}: {a!r} != {b!r}"]


def test_the_requests_it_takes_are_answered_as_the_sdk_transport_answers_them(served):
    source = served["source"]
    cases = [
        rpc("tools/list"), rpc("ping", rid="a-string-id"), rpc("resources/list"), rpc("resources/templates/list"),
        tool("search_content", {"query": "okapi census"}, rid=0), tool("list_sources", {}),
        tool("get_file_text", {"source_id": source, "key": "okapi.md"}),
        tool("search_content", {"query": "okapi", "limit": 0}),  # -32602 naming the field
        tool("search_content", {"query": "okapi", "no_such_argument": 1}),
        tool("no_such_tool", {}),
        rpc("resources/read", {"uri": f"kdbl://file/{source}/okapi.md"}),
        rpc("resources/read", {"uri": "kdbl://file/not-a-uuid/x"}),
    ]
    counted = Counted(served["app"])
    try:
        for message in cases:
            before = counted.taken
            single = post(served, message)
            assert counted.taken == before + 1, message
            counted.through_the_sdk(True)
            try:
                sdk = post(served, message)
            finally:
                counted.through_the_sdk(False)
            assert counted.taken == before + 1, message
            assert single.status_code == sdk.status_code == 200, message
            assert single.headers["content-type"] == sdk.headers["content-type"] == "application/json", message
            assert not differences(comparable(single.json()), comparable(sdk.json())), (
                message, differences(comparable(single.json()), comparable(sdk.json())))
            assert single.json()["id"] == message["id"], message
    finally:
        counted.through_the_sdk(False)
    answers = [post(served, m).json() for m in cases[4:6]]
    assert "<mark>okapi</mark>" in answers[0]["result"]["structuredContent"]["hits"][0]["snippet"]
    assert answers[1]["result"]["isError"] is False


def test_what_it_does_not_answer_exactly_as_the_transport_stays_with_the_sdk(served):
    counted = Counted(served["app"])
    search = tool("search_content", {"query": "okapi"})
    refused = [
        (search, {"Accept": "text/html"}, 406),  # the transport's Not Acceptable
        (search, {"Origin": "http://evil.example"}, 403),  # DNS-rebinding protection: an origin not allowed
        (search, {"Content-Type": "text/plain"}, 400),
    ]
    for message, headers, status in refused:
        assert post(served, message, headers).status_code == status, headers
    passed_on = [
        (tool("search_content", {"query": "okapi"}) | {"params": {"name": "search_content", "arguments": {
            "query": "okapi"}, "_meta": {"progressToken": "p-1"}}}, {}),  # asks for progress
        (rpc("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                            "clientInfo": {"name": "t", "version": "1"}}), {}),
        (search, {"MCP-Protocol-Version": "2025-03-26"}),  # a handshake version: still the SDK's answer
        ({"jsonrpc": "2.0", "method": "notifications/initialized"}, {}),
    ]
    answers = [post(served, message, headers) for message, headers in passed_on]
    assert [a.status_code for a in answers] == [200, 200, 200, 202]
    assert answers[0].json()["result"]["isError"] is False and "serverInfo" in answers[1].json()["result"]
    assert counted.taken == 1  # only the handshake version's search; the rest went to the SDK's transport


def test_a_result_body_is_the_sdk_models_json_also_where_orjson_cannot_encode_it():
    from mcp_types import JSONRPCResponse

    for rid, result in ((7, {"content": [{"type": "text", "text": "é <mark>"}], "score": 0.1}),
                        ("x", {}), (2**70, {"big": 2**80})):  # past 64 bits: orjson refuses, the model does not
        expected = JSONRPCResponse(jsonrpc="2.0", id=rid, result=result).model_dump_json(by_alias=True,
                                                                                         exclude_unset=True)
        assert json.loads(_result_body(rid, result)) == json.loads(expected)
