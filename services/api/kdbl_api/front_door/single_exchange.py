"""One JSON-RPC request answered with one JSON body through the MCP SDK's own single-exchange driver.

For every POST the SDK's stateless Streamable HTTP manager builds a transport, a pair of memory streams, a
JSON-RPC dispatcher and a server task in its task group, sends the request through the streams and waits on a
third stream for the answer (~1 ms of CPU a call here, a fifth of a search: issue 33). For a request the
stateless JSON transport would answer with one body, `SingleExchange` runs the same handler chain (the SDK's
`ServerRunner`: its validation, middleware, our handlers) in the request's own task with
`mcp.server.runner.serve_one` — the driver the SDK itself uses for single-exchange (2026-07-28) requests —
and writes the JSON-RPC answer as the transport would (status 200, `application/json`, the same JSON: a result,
already in its wire form from the SDK, in orjson's encoding — ~0.1 ms less than pydantic's model of the
envelope for a 20-hit search's 94 KB; an error in the SDK's own models; a handler's exception mapped by the
SDK's own `handler_exception_to_error_data`, anything else code 0 with its message, as the JSON-RPC dispatcher
does).

It takes only what it answers exactly as the transport does (`takes`), and leaves everything else to the SDK:
a header the transport would refuse (Content-Type, Host, Origin, Accept), a protocol version it routes
elsewhere, `initialize`, a notification or a reply, a message its JSON-RPC model refuses, and a call that asks
for progress (the JSON transport drops notifications; the SDK keeps deciding what that means).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import orjson
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_one
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp.shared.message import MessageMetadata, ServerMessageMetadata
from mcp.shared.transport_context import TransportContext
from mcp_types import DEFAULT_NEGOTIATED_VERSION, ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse, RequestId
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

# what the stateless JSON transport answers with one body and nothing else: the methods a client calls
# after the handshake (initialize stays with the SDK's transport, which answers it inline)
METHODS = frozenset({"tools/call", "tools/list", "resources/list", "resources/read", "resources/templates/list",
                     "ping"})
_VERSION_HEADER = "mcp-protocol-version"
_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(slots=True)
class _Exchange:
    """The SDK's `DispatchContext` for one request without a back channel (what the stateless JSON transport
    gives a handler: server-to-client requests raise NoBackChannelError, notifications have no wire)."""

    transport: TransportContext
    request_id: RequestId
    message_metadata: MessageMetadata
    cancel_requested: anyio.Event = field(default_factory=anyio.Event)
    can_send_request: bool = False

    async def send_raw_request(self, method: str, params: Mapping[str, Any] | None, opts: Any = None
                               ) -> dict[str, Any]:
        raise NoBackChannelError(method)

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: Any = None) -> None:
        return None  # no wire for a notification in a JSON answer

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        return None


class SingleExchange:
    """Answers the requests it `takes` with `server`'s handlers, under the same transport security settings
    as the SDK's session managers."""

    def __init__(self, server: Server[Any], security: TransportSecuritySettings) -> None:
        self.server = server
        self.security = TransportSecurityMiddleware(security)
        self._lifespan_state: Any = None
        self._running = False

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The server's lifespan, entered once (as each session manager does for its own requests)."""
        async with self.server.lifespan(self.server) as state:
            self._lifespan_state, self._running = state, True
            try:
                yield
            finally:
                self._lifespan_state, self._running = None, False

    async def takes(self, request: Request, message: dict[str, Any] | None) -> JSONRPCRequest | None:
        """The request as the SDK's model, when this answers it exactly as the stateless JSON transport
        would; None: the SDK's transport answers it."""
        if not self._running or not isinstance(message, dict) or message.get("method") not in METHODS:
            return None
        if "id" not in message or _progress_token(message.get("params")):
            return None
        headers = request.headers
        version = headers.get(_VERSION_HEADER)
        if version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None  # the manager routes it to its 2026-07-28 entry
        if not check_accept_headers(request)[0] or await self.security.validate_request(request, is_post=True):
            return None  # the transport's 406, 400, 421 or 403 (with kdbl_api.host_hint's body)
        try:
            return JSONRPCRequest.model_validate(message)
        except ValidationError:
            return None  # the transport's 400

    async def answer(self, rpc: JSONRPCRequest, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        exchange = _Exchange(transport=TransportContext(kind="streamable-http", can_send_request=False),
                             request_id=rpc.id, message_metadata=ServerMessageMetadata(request_context=request))
        connection = Connection.from_envelope(request.headers.get(_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION),
                                              None, None)
        try:
            result = await serve_one(self.server, exchange, rpc.method, rpc.params, connection=connection,
                                     lifespan_state=self._lifespan_state)
            body = _result_body(rpc.id, result)
        except Exception as exc:  # the JSON-RPC dispatcher's boundary, as the SDK's transport applies it
            error = handler_exception_to_error_data(exc)
            if error is None:
                log.exception("handler for %r raised", rpc.method)
                error = ErrorData(code=0, message=str(exc))
            body = JSONRPCError(jsonrpc="2.0", id=rpc.id, error=error).model_dump_json(by_alias=True,
                                                                                      exclude_unset=True).encode()
        await Response(body, headers=_JSON_HEADERS)(scope, receive, send)


def _result_body(request_id: RequestId, result: dict[str, Any]) -> bytes:
    """The JSON-RPC response: `result` is the SDK's JSON-mode dump (plain JSON types); an id or number orjson
    cannot encode (an integer past 64 bits) takes the SDK's model, as the transport would."""
    try:
        return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": result})
    except orjson.JSONEncodeError:
        return JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result).model_dump_json(
            by_alias=True, exclude_unset=True).encode()


def _progress_token(params: Any) -> bool:
    meta = params.get("_meta") if isinstance(params, dict) else None
    return isinstance(meta, dict) and meta.get("progressToken") is not None
