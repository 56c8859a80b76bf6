"""The front door's first part: it opens the call, answers what /mcp never serves, and starts the clock.

It builds the call's one Starlette `Request` (every later part reads headers, body and client address
from it) and its `kdbl_api.call_scope.Call` on the scope, with the `kdbl_api.request_meta.CallMeta`: the
request id (the client's sane `X-Request-Id` or a new one) goes on every response from here, refusals
included, and into the audit row and log line of every refusal. Then `KDBL_MCP_ENABLED=false` → 404 and
anything but POST → 405 (`Allow: POST`: no SSE stream on GET, no session to DELETE); those two are not
audited (no token was read). A `Call` an in-process caller left on the scope (kdbl_api.legacy_sse) only
passes on its `json_only`. When the call is answered the Call lets go of the Request, which refers to the
scope that holds the Call: no reference cycle is left for the garbage collector.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.asgi import with_headers
from kdbl_api.front_door.refusals import plain
from kdbl_api.request_meta import HEADER, CallMeta
from kdbl_core.errors import NotFound
from kdbl_core.settings import Settings


class OpenCall:
    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        asked = scope.get(KEY)
        call = scope[KEY] = Call(CallMeta.begin(request.headers.get("x-request-id")), request,
                                 json_only=asked is not None and asked.json_only)
        send = with_headers(send, {HEADER: call.meta.request_id})
        try:
            if not self.settings.mcp_enabled:
                off = NotFound("MCP is disabled on this server (KDBL_MCP_ENABLED=false)")
                await plain(off)(scope, receive, send)
                return
            if request.method != "POST":
                await Response("Method Not Allowed: this MCP endpoint is POST-only (no SSE stream)",
                               status_code=405, headers={"Allow": "POST"})(scope, receive, send)
                return
            call.started = time.perf_counter()
            await self.app(scope, receive, send)
        finally:
            call.request = None

