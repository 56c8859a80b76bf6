"""The legacy HTTP+SSE transport (MCP 2024-11-05), opt-in: `GET /sse` + `POST /messages?session_id=...`.

Some clients speak only the older transport (issue 18: one waited 20-30 s per search through a bridge).
With KDBL_LEGACY_SSE_ENABLED the API also serves it; off (the default), both paths are 404.

A session is an SSE stream and nothing else: `GET /sse` authenticates (the /mcp front door's own check,
`McpFrontDoor.authenticate`), opens the stream and sends the `endpoint` event naming
`/messages?session_id=<128 random bits>`. Each `POST /messages` authenticates again, must come from
the principal that opened the session (tenant, subject and token id; for an OIDC token, its subject),
is answered 202 at once, and its JSON-RPC message then goes through the whole /mcp path in this process
(the front door's policy, scope check, rate limits, audit rows with the call's request id, the same
stateless MCP server and tool code) as an in-process ASGI call; the JSON-RPC answer becomes the stream's
next `message` event. So nothing about a tool call differs between the two transports, and a refusal
that /mcp sends as an HTTP error (429 rate limited, 403 scope) reaches the SSE client as a JSON-RPC
error with its request's id instead of breaking the client's POST loop.

Refused on the POST itself: 401 (no or bad token, the /mcp challenge), 404 (no such session, or a
session of another principal: audited as `denied`, answered as if it did not exist), 429 (more than
MAX_IN_FLIGHT messages of one session unanswered), 400 (no session id, not JSON), 413/408 (body limits
of /mcp), 421/403 (Host/Origin outside KDBL_ALLOWED_HOSTS/ORIGINS, the SDK's check as on /mcp).
Metrics: `kdbl_sse_sessions` (open now) and `kdbl_sse_refused{reason}` (per_token, per_process, forbidden,
foreign_session); the calls themselves are counted as every /mcp call is.
Bounded: KDBL_LEGACY_SSE_MAX_SESSIONS_PER_TOKEN (429) and KDBL_LEGACY_SSE_MAX_SESSIONS per process
(503). A comment line every KDBL_LEGACY_SSE_KEEPALIVE_S (15 s) keeps an idle session inside the 60 s
idle timeouts of common proxies. A disconnect closes the session, cancels its unanswered calls and
frees its slot; so does a client that stops reading while its connection stays open (an event that
waits KDBL_LEGACY_SSE_SEND_TIMEOUT_S, 30 s, to be sent), instead of holding its slot until TCP gives up.

Sessions live in the process that holds the stream, so a session's POSTs must reach that process:
KDBL_API_WORKERS must be 1 (kdbl_api.main refuses otherwise) and, with several replicas, the chart's
Service uses `sessionAffinity: ClientIP` while legacy SSE is on (docs/clients.md).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from kdbl_api import audit, request_meta
from kdbl_api.audit import AuditFacts
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door import McpFrontDoor, disabled_message, read_body, replay
from kdbl_core.access.principal import Principal
from kdbl_core.errors import (
    INTERNAL_ERROR, PARSE_ERROR, Forbidden, KdblError, MalformedMessage, NotFound, RateLimited, RequestTimeout,
    RequestTooLarge, Unavailable, http_response_of, jsonrpc_response_of,
)
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

SSE_PATH = "/sse"
MESSAGES_PATH = "/messages"
MAX_IN_FLIGHT = 32  # unanswered messages per session; a client that floods POSTs gets 429, not unbounded tasks
OUTBOX = 64  # answers buffered for a slow reader before the calls that produce them wait


@dataclass(eq=False)
class Session:
    id: str
    owner: tuple[Any, ...]
    outbox: MemoryObjectSendStream[ServerSentEvent]
    inbox: MemoryObjectReceiveStream[ServerSentEvent]
    tasks: TaskGroup | None = None  # the stream's task group: the session's calls run in it
    in_flight: int = 0
    closed: bool = False


def owner_of(principal: Principal) -> tuple[Any, ...]:
    """Who may post into a session: the same tenant, subject and token (an OIDC token has no id: its
    subject, so a refreshed access token keeps the session)."""
    return (principal.tenant_id, principal.subject, principal.token_id)


class LegacySse:
    """The two endpoints (ASGI apps `stream` and `messages`) over the /mcp front door `door`."""

    def __init__(self, door: McpFrontDoor, settings: Settings) -> None:
        self.door = door
        self.settings = settings
        self.security = TransportSecurityMiddleware(TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=list(settings.allowed_hosts),
            allowed_origins=list(settings.allowed_origins)))
        self.sessions: dict[str, Session] = {}

    def count(self, owner: tuple[Any, ...] | None = None) -> int:
        return sum(1 for s in self.sessions.values() if owner is None or s.owner == owner)

    # --- GET /sse -------------------------------------------------------------------------------
    async def stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        refusal = await self._precheck(request, is_post=False)
        if refusal is None:
            access = await self.door.authenticate(request)
            if isinstance(access, Response):
                refusal = access
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        principal = access.principal
        policy = await self.door.policies.get(principal.tenant_id)
        owner = owner_of(principal)
        error: KdblError | None = None
        if not policy.enabled:
            error = Forbidden(disabled_message(principal.tenant_name), data={"tenant_disabled": True})
        elif self.count(owner) >= self.settings.legacy_sse_max_sessions_per_token:
            error = RateLimited(30, f"this token already holds {self.settings.legacy_sse_max_sessions_per_token} "
                                    "open SSE sessions (KDBL_LEGACY_SSE_MAX_SESSIONS_PER_TOKEN): close one first")
        elif self.count() >= self.settings.legacy_sse_max_sessions:
            error = Unavailable(f"this API process holds {self.settings.legacy_sse_max_sessions} open SSE sessions "
                                "(KDBL_LEGACY_SSE_MAX_SESSIONS); retry later or use POST /mcp", retry_after_sec=30)
        if error is not None:
            reason = "forbidden" if isinstance(error, Forbidden) else "per_token" if isinstance(error, RateLimited) \
                else "per_process"
            self.door.obs.sse_refused.labels(reason).inc()
            await self._audit_refusal(request, principal, "denied" if isinstance(error, Forbidden) else "rate_limited",
                                      error.message)
            await http_response_of(error).response()(scope, receive, send)
            return

        outbox, inbox = anyio.create_memory_object_stream[ServerSentEvent](OUTBOX)
        session = Session(uuid.uuid4().hex, owner, outbox, inbox)
        endpoint = f"{quote(scope.get('root_path', '').rstrip('/') + MESSAGES_PATH)}?session_id={session.id}"
        self.sessions[session.id] = session
        self.door.obs.sse_sessions.inc()
        log.info("sse session opened", extra={"session": session.id, "tenant": principal.tenant_name,
                                              "sessions": len(self.sessions)})

        async def events() -> AsyncIterator[ServerSentEvent]:
            yield ServerSentEvent(endpoint, event="endpoint")
            async for event in inbox:
                yield event

        try:
            async with anyio.create_task_group() as tasks:
                session.tasks = tasks
                try:
                    await EventSourceResponse(events(), ping=self.settings.legacy_sse_keepalive_s,
                                              send_timeout=self.settings.legacy_sse_send_timeout_s)(scope, receive, send)
                except* SendTimeoutError:  # the client stopped reading: drop it rather than hold its slot
                    log.warning("sse client stopped reading; session closed",
                                extra={"session": session.id, "send_timeout_s": self.settings.legacy_sse_send_timeout_s})
                tasks.cancel_scope.cancel()  # the client left: its unanswered calls are dropped
        finally:
            session.closed = True
            self.sessions.pop(session.id, None)
            self.door.obs.sse_sessions.dec()
            outbox.close()
            inbox.close()
            log.info("sse session closed", extra={"session": session.id, "sessions": len(self.sessions)})

    # --- POST /messages?session_id= -------------------------------------------------------------------
    async def messages(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        request_id = request_meta.sane_id(request.headers.get("x-request-id")) or uuid.uuid4().hex
        send = _with_request_id(send, request_id)
        response = await self._post(request, request_id)
        await response(scope, receive, send)

    async def _post(self, request: Request, request_id: str) -> Response:
        refusal = await self._precheck(request, is_post=True)
        if refusal is not None:
            return refusal
        access = await self.door.authenticate(request)
        if isinstance(access, Response):
            return access
        principal = access.principal
        session_id = request.query_params.get("session_id")
        if not session_id:
            return jsonrpc_response_of(MalformedMessage("session_id", "session_id is required: the URL the "
                                                        "endpoint event named")).response()
        session = self.sessions.get(session_id)
        if session is not None and session.owner != owner_of(principal):
            log.warning("sse post refused", extra={"session": session_id, "tenant": principal.tenant_name,
                                                   "request_id": request_id})
            request.scope[KEY] = Call(request_meta.CallMeta(request_id=request_id))  # the audit row's request id
            self.door.obs.sse_refused.labels("foreign_session").inc()
            await self._audit_refusal(request, principal, "denied", "POST into an SSE session another principal opened")
            session = None
        if session is None or session.closed or session.tasks is None:
            return jsonrpc_response_of(NotFound(
                "no such SSE session for this token: open one with GET /sse (sessions end when their stream "
                "closes)")).response()
        if session.in_flight >= MAX_IN_FLIGHT:
            return jsonrpc_response_of(RateLimited(1, f"{MAX_IN_FLIGHT} messages of this session are still "
                                                      "unanswered; wait for their answers")).response()
        try:
            body = await read_body(request, self.settings)
        except TimeoutError:
            message = f"request body not received within {self.settings.body_read_timeout_s:g} s"
            return jsonrpc_response_of(RequestTimeout(message), headers={"Connection": "close"}).response()
        if body is None:
            return jsonrpc_response_of(RequestTooLarge(
                f"request body exceeds {self.settings.max_request_bytes} bytes")).response()
        try:
            message = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return jsonrpc_response_of(MalformedMessage("body", "not JSON", parse_error=True)).response()
        message_id = message.get("id") if isinstance(message, dict) else None
        inner = _mcp_scope(request.scope, len(body), request_id)
        session.in_flight += 1
        try:
            session.tasks.start_soon(self._dispatch, session, inner, body, message_id)
        except RuntimeError:  # the stream closed between the lookup and now
            session.in_flight -= 1
            return jsonrpc_response_of(NotFound("the SSE session closed")).response()
        return Response("Accepted", status_code=202)

    async def _dispatch(self, session: Session, scope: Scope, body: bytes, message_id: Any) -> None:
        """The message through the /mcp front door, in-process; its answer onto the session's stream."""
        status, chunks = 0, []

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        try:
            try:
                await self.door(scope, replay(body), capture)
                answer = _answer(b"".join(chunks), status, message_id)
            except KdblError as exc:  # the database went away mid-call (503 on /mcp): one error, not the stream
                answer = json.dumps(jsonrpc_response_of(exc, message_id).body) if message_id is not None else None
            except Exception:  # noqa: BLE001 - an unexpected failure ends this call, never the session
                log.exception("sse message failed", extra={"session": session.id})
                answer = json.dumps(jsonrpc_response_of(KdblError("internal error; the server logged it"),
                                                        message_id).body) if message_id is not None else None
            if answer is not None:
                await session.outbox.send(ServerSentEvent(answer, event="message"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the client left before its answer
        finally:
            session.in_flight -= 1

    # --- shared checks ---------------------------------------------------------------------------------
    async def _precheck(self, request: Request, *, is_post: bool) -> Response | None:
        if not self.settings.mcp_enabled:
            return http_response_of(NotFound("MCP is disabled on this server (KDBL_MCP_ENABLED=false)")).response()
        return await self.security.validate_request(request, is_post=is_post)

    async def _audit_refusal(self, request: Request, principal: Principal, status: str, reason: str) -> None:
        tool = "sse" if request.url.path.endswith(SSE_PATH) else "sse/messages"
        row = audit.audit_row(principal, request, tool, {}, AuditFacts.refused(status, reason), time.perf_counter())
        await audit.write_alone(self.door.pool, principal, row)


def _answer(payload: bytes, status: int, message_id: Any) -> str | None:
    """The /mcp answer as the stream's JSON-RPC message: None for a notification's empty 202. A refusal
    /mcp sends before it parses the message (rate limit, scope, policy) has id null there (its HTTP
    exchange pairs it with the request); on a stream it carries the request's id, or the client would
    wait for it forever."""
    if not payload.strip():
        return None
    try:
        answer = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        answer = None
    if not (isinstance(answer, dict) and answer.get("jsonrpc") == "2.0"):
        if message_id is None:
            return None
        answer = {"jsonrpc": "2.0", "id": message_id,
                  "error": {"code": INTERNAL_ERROR, "message": f"the server answered HTTP {status}"}}
    elif answer.get("id") is None and message_id is not None and "error" in answer \
            and answer["error"].get("code") != PARSE_ERROR:
        answer["id"] = message_id
    else:
        return payload.decode()
    return json.dumps(answer)


def _mcp_scope(scope: Scope, length: int, request_id: str) -> Scope:
    """The POST's scope as a POST /mcp of the same client (its address, Host, Origin and token), with the
    headers a Streamable HTTP request needs and the session's request id."""
    drop = {b"content-length", b"content-type", b"accept", b"x-request-id"}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in drop]
    headers += [(b"content-type", b"application/json"), (b"accept", b"application/json, text/event-stream"),
                (b"content-length", str(length).encode()), (b"x-request-id", request_id.encode())]
    inner = {k: v for k, v in scope.items() if k not in ("endpoint", "path_params", "route", "router")}
    inner.update(method="POST", path="/mcp", raw_path=b"/mcp", query_string=b"", headers=headers)
    # this caller reads one JSON answer, never an SSE stream: the door keeps the wish of a Call left here
    inner[KEY] = Call(request_meta.CallMeta(request_id=request_id), json_only=True)
    return inner


def _with_request_id(send: Send, request_id: str) -> Send:
    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []),
                                              (b"x-request-id", request_id.encode())]}
        await send(message)

    return wrapped
