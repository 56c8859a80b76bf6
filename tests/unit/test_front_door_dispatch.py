"""kdbl_api.front_door.dispatch in process: the caller on the scope as the MCP SDK reads it, the body replayed
to the SDK's app with the rate limiter's headers on the answer, and a streaming tool's call with a progress
token to the streaming app — unless the caller reads JSON only."""

from __future__ import annotations

from front_door_doubles import Downstream, drive, opened, principal, tool_call
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from starlette.responses import Response

from kdbl_api.bearer import PrincipalToken
from kdbl_api.front_door.dispatch import Dispatch
from kdbl_api.ratelimit import Decision
from kdbl_api.tools.registry import STREAMING_TOOLS
from kdbl_core.access.principal import SCOPE_SEARCH

ADA = principal(SCOPE_SEARCH)
SSE = {"Accept": "application/json, text/event-stream"}
ASK = tool_call("answer", {"question": "why?"}, _meta={"progressToken": "p-1"})


async def test_the_sdk_gets_the_caller_in_scope_user_the_body_replayed_and_the_ratelimit_headers():
    sdk = Downstream()
    scope, call = opened(ADA, message=tool_call("search_content", {"query": "q"}),
                         decision=Decision(True, 0, 60, 59, 1, "60;w=60"))
    answer = await drive(Dispatch(sdk), scope)
    assert answer.status == 200 and answer.header("ratelimit-remaining") == "59"
    assert sdk.bodies == [call.body]
    user = scope["user"]
    assert isinstance(user, AuthenticatedUser) and isinstance(user.access_token, PrincipalToken)
    assert user.access_token.principal is ADA and list(scope["auth"].scopes) == [SCOPE_SEARCH]


async def test_a_streaming_tools_call_with_a_progress_token_from_an_sse_client_is_streamed():
    assert "answer" in STREAMING_TOOLS
    sdk, streaming = Downstream(), Downstream()
    scope, _ = opened(ADA, message=ASK, headers=SSE)
    await drive(Dispatch(sdk, streaming), scope)
    assert len(streaming.reached) == 1 and sdk.reached == []


async def test_every_other_call_keeps_its_one_json_body():
    cases = [
        (ASK, {"Accept": "application/json"}, False),  # the client does not accept SSE
        (tool_call("answer", {"question": "why?"}), SSE, False),  # no progress token
        (tool_call("answer", {"question": "why?"}, _meta={"progressToken": True}), SSE, False),  # not a token
        (tool_call("search_content", {"query": "q"}, _meta={"progressToken": 1}), SSE, False),  # no streaming
        (ASK, SSE, True),  # the caller reads one JSON body (the legacy SSE transport)
    ]
    for message, headers, json_only in cases:
        sdk, streaming = Downstream(), Downstream()
        scope, call = opened(ADA, message=message, headers=headers)
        call.json_only = json_only
        await drive(Dispatch(sdk, streaming), scope)
        assert len(sdk.reached) == 1 and streaming.reached == [], (message, headers, json_only)
    sdk = Downstream()
    scope, _ = opened(ADA, message=ASK, headers=SSE)
    await drive(Dispatch(sdk), scope)  # no streaming app
    assert len(sdk.reached) == 1


async def test_a_streamed_call_hears_the_client_leave_after_its_body():
    heard = []

    async def streaming(scope, receive, send):
        heard.extend([await receive(), await receive()])
        await Downstream()(scope, receive, send)

    scope, call = opened(ADA, message=ASK, headers=SSE)
    sent = []

    async def receive():
        return {"type": "http.disconnect", "from": "the connection"}

    async def send(message):
        sent.append(message)

    await Dispatch(Downstream(), streaming)(scope, receive, send)
    assert heard[0] == {"type": "http.request", "body": call.body, "more_body": False}
    assert heard[1] == {"type": "http.disconnect", "from": "the connection"}


class Single:
    """A stand-in for kdbl_api.front_door.single_exchange.SingleExchange: takes what `takes` says, answers 200."""

    def __init__(self, takes: bool) -> None:
        self.takes_it = takes
        self.asked: list[dict] = []
        self.answered: list[bytes] = []

    async def takes(self, request, message):
        self.asked.append(message)
        return message if self.takes_it else None

    async def answer(self, rpc, scope, receive, send):
        self.answered.append((await receive())["body"])
        await Response(b'{"single": true}', media_type="application/json")(scope, receive, send)


async def test_a_request_the_single_exchange_takes_is_answered_there_with_the_body_and_the_headers():
    sdk, single = Downstream(), Single(takes=True)
    scope, call = opened(ADA, message=tool_call("search_content", {"query": "q"}),
                         decision=Decision(True, 0, 60, 59, 1, "60;w=60"))
    answer = await drive(Dispatch(sdk, single=single), scope)
    assert answer.status == 200 and answer.header("ratelimit-remaining") == "59"
    assert single.answered == [call.body] and sdk.reached == []
    assert isinstance(scope["user"], AuthenticatedUser)  # the caller is on the scope before the SDK's handlers run


async def test_what_the_single_exchange_does_not_take_and_streamed_calls_go_to_the_sdk():
    sdk, single = Downstream(), Single(takes=False)
    scope, call = opened(ADA, message=tool_call("search_content", {"query": "q"}))
    await drive(Dispatch(sdk, single=single), scope)
    assert len(sdk.reached) == 1 and sdk.bodies == [call.body] and single.answered == []
    sdk, streaming, single = Downstream(), Downstream(), Single(takes=True)
    scope, _ = opened(ADA, message=ASK, headers=SSE)
    await drive(Dispatch(sdk, streaming, single), scope)
    assert len(streaming.reached) == 1 and single.asked == [] and sdk.reached == []
