"""The front door's last part: the caller on the scope as the SDK reads it, and the body to the SDK's app.

`scope["user"]` (the SDK's `AuthenticatedUser` over our `PrincipalToken`) and `scope["auth"]` (its scopes)
are set here (kdbl_api.bearer.authenticated), once every check has passed; the handlers read the rest from
the call (kdbl_api.call_scope). The body the door read is replayed to the SDK; the answer carries the rate
limiter's RateLimit-* headers.

Every call is answered with one JSON body, except a tools/call of a tool that streams
(registry.STREAMING_TOOLS: answer) whose client asked for progress (params._meta.progressToken) and accepts
SSE: that one goes to the streaming app (a second stateless session manager, kdbl_api.app), so the same POST
answers with notifications, then the result. A streamed call's receive is, after the body, the connection's
own, so the client going away cancels the call. A caller that reads one JSON body (`Call.json_only`: the
legacy SSE transport's in-process calls) is never streamed to. A request answered with one JSON body that the
SDK's stateless JSON transport would answer exactly so goes through the SDK's single-exchange driver in this
task instead of through a transport of its own (kdbl_api.front_door.single_exchange; ~1 ms of CPU less a call).
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api import bearer
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.asgi import replay, with_headers
from kdbl_api.front_door.single_exchange import SingleExchange
from kdbl_api.tools.registry import STREAMING_TOOLS


class Dispatch:
    def __init__(self, sdk_app: ASGIApp, streaming_app: ASGIApp | None = None,
                 single: SingleExchange | None = None) -> None:
        self.sdk_app = sdk_app
        self.streaming_app = streaming_app  # SSE responses, for tools/calls with a progress token
        self.single = single  # one JSON answer without a transport of its own, where it is the same answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        bearer.authenticated(scope, call.access)
        send = with_headers(send, call.decision.headers() if call.decision else None)
        if self.streaming_app is not None and not call.json_only and wants_progress(call.message, scope):
            # an SSE response listens for the client going away (that cancels the call): after the body,
            # the connection's own receive, which reports the disconnect when it happens
            await self.streaming_app(scope, replay(call.body, then=receive), send)
            return
        single = self.single
        if single is not None and call.request is not None:
            rpc = await single.takes(call.request, call.message)
            if rpc is not None:
                await single.answer(rpc, scope, replay(call.body), send)
                return
        await self.sdk_app(scope, replay(call.body), send)


def wants_progress(message: dict[str, Any], scope: Scope) -> bool:
    """A tools/call of a tool that streams, with a progress token, from a client that accepts SSE."""
    if message.get("method") != "tools/call":
        return False
    params = message.get("params")
    if not isinstance(params, dict) or params.get("name") not in STREAMING_TOOLS:
        return False
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    if not isinstance(token, str | int) or isinstance(token, bool):
        return False
    accept = dict(scope.get("headers") or ()).get(b"accept", b"")
    return b"text/event-stream" in accept
