"""The /mcp front door: method check, bearer authentication, body limit and scope check, then the SDK.

401s carry `WWW-Authenticate: Bearer ... resource_metadata="..."` (RFC 9728); a token without the
scope a call needs is refused with 403 `insufficient_scope` before the SDK parses anything (the one
scope check: kdbl_api.scope_check).

Then the tenant's policy (kdbl_core.access.policy, at most 2 s old): a disabled tenant's tokens get 403;
a tool outside the allowlist passes as an unknown tool would (the SDK layer refuses it), and
resources/* (get_file_text by another name) get 403 unless get_file_text is allowed; requests
that do work take from the shared rate-limit buckets (kdbl_api.ratelimit) and carry RateLimit-*
headers. Last, a call takes its cost in its tenant's slots (kdbl_api.fair_share: calls in flight per
tenant and process), waiting briefly or refused 429 + Retry-After, and gives them back once answered.
Every refusal here writes an audit row (kdbl_api.audit). Each refusal is a
kdbl_core.errors class rendered by `jsonrpc_response_of` (its JSON-RPC code and HTTP status).

First of all the door opens the call's `kdbl_api.request_meta.CallMeta`: its request id (the client's
sane `X-Request-Id` or a new one) is on every response from here, refusals included, and in the
audit row and log line of every refusal; its `auth` time is this door's work before the SDK.
"""

from __future__ import annotations

import json
import logging
import time
from functools import partial
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kdbl_api import audit, bearer, fair_share, jsonrpc_envelope, request_meta, scope_check
from kdbl_api.audit import AuditFacts
from kdbl_api.bearer import PrincipalToken, SdkTokenVerifier
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import Decision, RateLimiter
from kdbl_api.call_runner import POLICY_KEY
from kdbl_api.tools.registry import STREAMING_TOOLS
from kdbl_core.access.policy import Policies
from kdbl_core.access.tokens import TokenRefused
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.errors import (
    PARSE_ERROR, Forbidden, KdblError, NotFound, RateLimited, RequestTimeout, RequestTooLarge, Unauthenticated,
    http_response_of, jsonrpc_response_of,
)
from kdbl_core import pacing
from kdbl_core.access.principal import Principal
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)
PRM_PATH = "/.well-known/oauth-protected-resource"


def public_base(request: Request, settings: Settings) -> str:
    if settings.api_public_url:
        return settings.api_public_url.rstrip("/")
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def _refuse(exc: KdblError, headers: dict[str, str] | None = None) -> Response:
    """The error as a JSON-RPC response with its class's HTTP status (kdbl_core.errors renders both)."""
    return jsonrpc_response_of(exc, headers=headers).response()


def _plain(exc: KdblError, headers: dict[str, str] | None = None) -> Response:
    """The error as a plain HTTP answer, `{"error": message, ...}` (a route that is not JSON-RPC)."""
    return http_response_of(exc, headers).response()


def disabled_message(tenant_name: str) -> str:
    return f"tenant '{tenant_name}' is disabled: its tokens are refused until an administrator enables it"


class McpFrontDoor:
    def __init__(self, sdk_app: ASGIApp, verifier: SdkTokenVerifier, settings: Settings, limiter: RateLimiter,
                 observability: Observability, policies: Policies, pool: AsyncPool,
                 streaming_app: ASGIApp | None = None, share: fair_share.FairShare | None = None) -> None:
        self.sdk_app = sdk_app
        self.streaming_app = streaming_app  # SSE responses, for tools/calls with a progress token
        self.verifier = verifier
        self.settings = settings
        self.limiter = limiter
        self.obs = observability
        self.policies = policies
        self.pool = pool
        self.share = share if share is not None else fair_share.FairShare(observability, pool_size=pool.size)

    async def quota(self, principal: Principal) -> dict[str, Any]:
        """/capacity's rate_limit: the caller's tiers (per token, tenant) and what is left of the tightest
        bucket (read without taking anything; null when no tier applies)."""
        policy = await self.policies.get(principal.tenant_id)
        decision = await self.limiter.peek(principal, policy)
        return {**policy.describe()["rate_limit"], "remaining": decision.as_json() if decision else None,
                "scope": "shared by every API replica (token buckets in PostgreSQL)"}

    async def authenticate(self, request: Request, *, route: str | None = None) -> PrincipalToken | Response:
        """The request's bearer token verified, or the refusal to send: 401 with its challenge, 429 +
        Retry-After, 403 (an admin token); a known token's refusal is audited and every refusal counted.
        Every route that takes a token authenticates here (/mcp, the legacy SSE endpoints, /capacity), so all
        refuse alike. `route`: a plain HTTP route (not JSON-RPC): its refusals are `{"error": ...}` bodies and
        its audit rows name it."""
        refuse = _refuse if route is None else _plain
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self.obs.auth_failures.labels("missing").inc()
            return refuse(Unauthenticated("authentication required: send Authorization: Bearer <token>"),
                          {"WWW-Authenticate": self._challenge(request)})
        started = time.perf_counter()
        try:
            return await self.verifier.authenticate(token.strip())
        except TokenRefused as exc:  # a known token of a known tenant: audited
            self.obs.auth_failures.labels("invalid").inc()
            if exc.tenant_id is not None:
                who = Principal(tenant_id=exc.tenant_id, tenant_name=exc.tenant_name, subject=exc.subject,
                                token_id=exc.token_id)
                await self._refused(request, who, [(route, route, {})] if route else [], "unauthenticated",
                                    exc.message, started)
            return refuse(exc, {"WWW-Authenticate": self._challenge(request, "invalid_token", exc.message)})
        except Unauthenticated as exc:
            self.obs.auth_failures.labels("invalid").inc()
            return refuse(exc, {"WWW-Authenticate": self._challenge(request, "invalid_token", exc.message)})
        except RateLimited as exc:
            self.obs.auth_failures.labels("throttled").inc()
            return refuse(exc)
        except Forbidden as exc:
            self.obs.auth_failures.labels("forbidden").inc()
            return refuse(exc)

    async def _refused(self, request: Request, principal: Principal, calls: list[tuple[str, str, Any]],
                       status: str, reason: str, started: float) -> None:
        _, tool, arguments = calls[0] if calls else ("", "mcp", {})
        facts = AuditFacts.refused(status, reason)
        meta = request_meta.of_scope(request.scope)
        log.info("mcp request refused", extra={"request_id": meta.request_id if meta else None, "tool": tool,
                                               "status": status})
        await audit.write_alone(self.pool, principal,
                                      audit.audit_row(principal, request, tool, arguments, facts, started))

    def _challenge(self, request: Request, error: str | None = None, description: str | None = None,
                   scope: str | None = None) -> str:
        parts = ['Bearer realm="kdbl"']
        if error:
            parts.append(f'error="{error}"')
        if description:
            parts.append(f'error_description="{description}"')
        if scope:
            parts.append(f'scope="{scope}"')
        parts.append(f'resource_metadata="{public_base(request, self.settings)}{PRM_PATH}/mcp"')
        return ", ".join(parts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        meta = scope[request_meta.SCOPE_KEY] = request_meta.CallMeta.begin(request.headers.get("x-request-id"))
        send = _with_headers(send, {request_meta.HEADER: meta.request_id})
        if not self.settings.mcp_enabled:
            await http_response_of(NotFound("MCP is disabled on this server (KDBL_MCP_ENABLED=false)")
                                   ).response()(scope, receive, send)
            return
        if request.method != "POST":
            await Response("Method Not Allowed: this MCP endpoint is POST-only (no SSE stream)",
                           status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return

        started = time.perf_counter()
        access = await self.authenticate(request)
        if isinstance(access, Response):
            await access(scope, receive, send)
            return

        principal = access.principal
        policy = await self.policies.get(principal.tenant_id)
        try:
            body = await self.read_body(request)
        except TimeoutError:  # a stalled body holds a connection: 408, and uvicorn closes it
            message = f"request body not received within {self.settings.body_read_timeout_s:g} s"
            await _refuse(RequestTimeout(message), {"Connection": "close"})(scope, receive, send)
            return
        if body is None:
            await _refuse(RequestTooLarge(f"request body exceeds {self.settings.max_request_bytes} bytes"))(
                scope, receive, send)
            return
        try:
            message = jsonrpc_envelope.parse(body)
        except jsonrpc_envelope.EnvelopeError as exc:  # not one valid JSON-RPC message: answered naming the field
            calls = [] if exc.jsonrpc_code == PARSE_ERROR else _calls(body)
            await self._refused(request, principal, calls, "error", exc.message, started)
            await jsonrpc_response_of(exc, exc.request_id).response()(scope, receive, send)
            return
        calls = _calls_of(message)  # the envelope parsed it: one message, no second json.loads
        if not policy.enabled:
            self.obs.auth_failures.labels("forbidden").inc()
            message = disabled_message(principal.tenant_name)
            await self._refused(request, principal, calls, "denied", message, started)
            await _refuse(Forbidden(message, data={"tenant_disabled": True}))(scope, receive, send)
            return
        missing = scope_check.missing_scope(calls, principal.scopes, policy)
        if missing:
            refusal = scope_check.refusal(missing)
            await self._refused(request, principal, calls, "denied", refusal.message, started)
            await _refuse(refusal, {
                "WWW-Authenticate": self._challenge(request, "insufficient_scope", None, missing)})(
                scope, receive, send)
            return
        if not policy.allows_tool("get_file_text") and any(m.startswith("resources/") for m, _, _ in calls):
            # a resource read is get_file_text by another name: the allowlist governs both
            message = "resources are not available to this tenant (get_file_text is not in its tool allowlist)"
            await self._refused(request, principal, calls, "denied", message, started)
            await _refuse(Forbidden(message))(scope, receive, send)
            return
        decision: Decision | None = None
        if any(method in _COUNTED or method.startswith("resources/") for method, _, _ in calls):
            decision = await self.limiter.take(principal, policy)
            if decision is not None and not decision.allowed:
                self.obs.rate_limited.inc()
                exc = RateLimited(decision.retry_after_sec)
                await self._refused(request, principal, calls, "rate_limited", exc.message, started)
                await _refuse(exc, decision.headers())(scope, receive, send)
                return

        bearer.authenticated(scope, access)
        scope[POLICY_KEY] = policy
        meta.add("auth", meta.started)
        slot: fair_share.Slot | None = None
        units = sum(fair_share.cost(method, tool, arguments) for method, tool, arguments in calls)
        if units:
            queued = time.perf_counter()
            try:
                slot = await self.share.acquire(principal.tenant_id, principal.tenant_name, units, policy.limits)
            except RateLimited as exc:  # the tenant's slots stayed full: 429 + Retry-After, audited
                await self._refused(request, principal, calls, "rate_limited", exc.message, started)
                await _refuse(exc, decision.headers() if decision else None)(scope, receive, send)
                return
            if slot.waited_s:
                meta.add("queue", queued)
        headers = _with_headers(send, decision.headers() if decision else None)
        paced = pacing.use(partial(self.share.defer, principal.tenant_id)) if slot is not None else None
        try:
            if self.streaming_app is not None and _wants_progress(message, scope):
                # an SSE response listens for the client going away (that cancels the call): after the body,
                # the connection's own receive, which reports the disconnect when it happens
                await self.streaming_app(scope, replay(body, then=receive), headers)
            else:
                await self.sdk_app(scope, replay(body), headers)
        finally:
            if paced is not None:
                pacing.reset(paced)
            if slot is not None:
                slot.release()

    async def read_body(self, request: Request) -> bytes | None:
        """The body (None: over the size limit); TimeoutError if it does not arrive in
        KDBL_BODY_READ_TIMEOUT_S (a client that sent headers and half a body held it > 25 s)."""
        limit = self.settings.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        with anyio.fail_after(self.settings.body_read_timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    return None
                chunks.append(chunk)
        return b"".join(chunks)


_COUNTED = frozenset({"tools/call", "tools/list"})


def _calls(body: bytes) -> list[tuple[str, str, Any]]:
    """(method, tool name or method, arguments) of each request in the body (notifications and replies left out)."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return []  # the SDK answers parse errors
    return [call for message in (payload if isinstance(payload, list) else [payload])
            for call in _calls_of(message)]


def _calls_of(message: Any) -> list[tuple[str, str, Any]]:
    """`_calls` of one parsed message: [] for a notification, a reply or something that is no request."""
    if not isinstance(message, dict) or not isinstance(message.get("method"), str) or "id" not in message:
        return []
    method, params = message["method"], message.get("params")
    params = params if isinstance(params, dict) else {}
    if method == "tools/call" and isinstance(params.get("name"), str):
        return [(method, params["name"], params.get("arguments") or {})]
    return [(method, method, params if method.startswith("resources/") else {})]


JSON_ONLY_KEY = "kdbl.json_only"  # set by an in-process caller that reads one JSON body (kdbl_api.legacy_sse)


def _wants_progress(message: dict[str, Any], scope: Scope) -> bool:
    """A tools/call of a tool that streams (registry.STREAMING_TOOLS: answer) whose client asked for
    progress (params._meta.progressToken) and accepts SSE: it is answered on an SSE stream
    (notifications, then the result). Every other call keeps its one JSON body."""
    if message.get("method") != "tools/call" or scope.get(JSON_ONLY_KEY):
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


def _with_headers(send: Send, headers: dict[str, str] | None) -> Send:
    if not headers:
        return send
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *raw]}
        await send(message)

    return wrapped


def replay(body: bytes, then: Receive | None = None) -> Receive:
    """The body read once, again; after it a disconnect at once, or `then`'s messages."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive
