"""The front door's body part: the body read within its limits, then its JSON-RPC envelope checked, once.

The body is read whole before anything else looks at it: over KDBL_MAX_REQUEST_BYTES (declared in
Content-Length or counted while it arrives) → 413; not all there within KDBL_BODY_READ_TIMEOUT_S → 408 with
`Connection: close` (a client that sent headers and half a body held a connection > 25 s). Neither is
audited (nothing of the call is known yet). Then kdbl_api.jsonrpc_envelope.parse (one orjson parse) checks
the message: a refusal names the field and echoes a usable request id, and is audited as `error` with the
request's tool when the JSON parsed. What passes is on the call: `Call.body` (the SDK gets it replayed),
`Call.message`, and `Call.calls`, the (method, tool, arguments) of the request the later checks read.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api import jsonrpc_envelope
from kdbl_api.call_scope import KEY, Call, CallOf
from kdbl_api.front_door.refusals import Refusals, jsonrpc
from kdbl_core.errors import PARSE_ERROR, RequestTimeout, RequestTooLarge, jsonrpc_response_of
from kdbl_core.settings import Settings


class ReadEnvelope:
    def __init__(self, app: ASGIApp, settings: Settings, refusals: Refusals) -> None:
        self.app = app
        self.settings = settings
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        try:
            body = await read_body(call.request, self.settings)
        except TimeoutError:  # a stalled body holds a connection: 408, and uvicorn closes it
            message = f"request body not received within {self.settings.body_read_timeout_s:g} s"
            await jsonrpc(RequestTimeout(message), {"Connection": "close"})(scope, receive, send)
            return
        if body is None:
            await jsonrpc(RequestTooLarge(f"request body exceeds {self.settings.max_request_bytes} bytes"))(
                scope, receive, send)
            return
        try:
            call.message = jsonrpc_envelope.parse(body)
        except jsonrpc_envelope.EnvelopeError as exc:  # not one valid JSON-RPC message: 400 naming the field
            await self.refusals.refused(call, "error", exc.message, [] if exc.jsonrpc_code == PARSE_ERROR
                                        else _calls(body))
            await jsonrpc_response_of(exc, exc.request_id).response()(scope, receive, send)
            return
        call.body, call.calls = body, calls_of(call.message)  # one message, no second json.loads
        await self.app(scope, receive, send)


async def read_body(request: Request, settings: Settings) -> bytes | None:
    """The body (None: over KDBL_MAX_REQUEST_BYTES); TimeoutError if it does not arrive within
    KDBL_BODY_READ_TIMEOUT_S. The legacy SSE transport reads its POSTs with it too."""
    limit = settings.max_request_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    with anyio.fail_after(settings.body_read_timeout_s):
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
    return b"".join(chunks)


def _calls(body: bytes) -> list[CallOf]:
    """`calls_of` each message in a body the envelope refused (a batch, say): for its audit row."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return []
    return [call for message in (payload if isinstance(payload, list) else [payload])
            for call in calls_of(message)]


def calls_of(message: Any) -> list[CallOf]:
    """(method, tool name or method, arguments) of a request: [] for a notification, a reply or something
    that is no request. A tools/call names its tool; resources/* keep their params as arguments."""
    if not isinstance(message, dict) or not isinstance(message.get("method"), str) or "id" not in message:
        return []
    method, params = message["method"], message.get("params")
    params = params if isinstance(params, dict) else {}
    if method == "tools/call" and isinstance(params.get("name"), str):
        return [(method, params["name"], params.get("arguments") or {})]
    return [(method, method, params if method.startswith("resources/") else {})]
