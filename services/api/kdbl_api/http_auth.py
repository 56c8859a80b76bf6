"""The /mcp front door: method check, bearer authentication, body limit and scope check, then the SDK.

401s carry `WWW-Authenticate: Bearer ... resource_metadata="..."` (RFC 9728); a token without the
scope a tools/call needs is refused with 403 `insufficient_scope` before the SDK parses anything.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kdbl_api import jsonrpc_envelope
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import RateLimiter
from kdbl_api.server import PRINCIPAL_KEY
from kdbl_api.tools.registry import TOOLS
from kdbl_core.auth.verifier import BearerVerifier
from kdbl_core.errors import Forbidden, RateLimited, Unauthenticated
from kdbl_core.principal import SCOPE_READ
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)
PRM_PATH = "/.well-known/oauth-protected-resource"


def public_base(request: Request, settings: Settings) -> str:
    if settings.api_public_url:
        return settings.api_public_url.rstrip("/")
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def _jsonrpc_error(status: int, code: int, message: str, headers: dict[str, str] | None = None,
                   data: dict[str, Any] | None = None) -> Response:
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return JSONResponse({"jsonrpc": "2.0", "id": None, "error": error}, status_code=status, headers=headers)


def _too_many_requests(exc: RateLimited) -> Response:
    return _jsonrpc_error(429, exc.jsonrpc_code, exc.message, {"Retry-After": str(exc.retry_after_sec)},
                          {"retry_after_sec": exc.retry_after_sec})


class McpFrontDoor:
    def __init__(self, sdk_app: ASGIApp, verifier: BearerVerifier, settings: Settings, limiter: RateLimiter,
                 observability: Observability) -> None:
        self.sdk_app = sdk_app
        self.verifier = verifier
        self.settings = settings
        self.limiter = limiter
        self.obs = observability

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
        if not self.settings.mcp_enabled:
            await JSONResponse({"error": "MCP is disabled on this server (KDBL_MCP_ENABLED=false)"},
                               status_code=404)(scope, receive, send)
            return
        if request.method != "POST":
            await Response("Method Not Allowed: this MCP endpoint is POST-only (no SSE stream)",
                           status_code=405, headers={"Allow": "POST"})(scope, receive, send)
            return

        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self.obs.auth_failures.labels("missing").inc()
            await _jsonrpc_error(401, -32001, "authentication required: send Authorization: Bearer <token>",
                                 {"WWW-Authenticate": self._challenge(request)})(scope, receive, send)
            return
        try:
            principal = await self.verifier.verify(token.strip())
        except Unauthenticated as exc:
            self.obs.auth_failures.labels("invalid").inc()
            await _jsonrpc_error(401, -32001, exc.message, {
                "WWW-Authenticate": self._challenge(request, "invalid_token", exc.message)})(scope, receive, send)
            return
        except RateLimited as exc:
            self.obs.auth_failures.labels("throttled").inc()
            await _too_many_requests(exc)(scope, receive, send)
            return
        except Forbidden as exc:
            self.obs.auth_failures.labels("forbidden").inc()
            await _jsonrpc_error(403, exc.jsonrpc_code, exc.message)(scope, receive, send)
            return

        wait = self.limiter.check(str(principal.token_id or principal.subject + "@" + principal.tenant_name))
        if wait:
            self.obs.rate_limited.inc()
            await _too_many_requests(RateLimited(wait))(scope, receive, send)
            return

        body = await self._read_body(request)
        if body is None:
            await _jsonrpc_error(413, -32600, f"request body exceeds {self.settings.max_request_bytes} bytes")(
                scope, receive, send)
            return
        try:
            jsonrpc_envelope.parse(body)
        except jsonrpc_envelope.EnvelopeError as exc:  # not one valid JSON-RPC message: answered naming the field
            await JSONResponse(exc.body(), status_code=exc.error.http_status)(scope, receive, send)
            return
        missing = _missing_scope(body, principal.scopes)
        if missing:
            await _jsonrpc_error(403, -32003, f"insufficient scope: this call needs '{missing}'", {
                "WWW-Authenticate": self._challenge(request, "insufficient_scope", None, missing)},
                {"required_scope": missing})(scope, receive, send)
            return

        scope[PRINCIPAL_KEY] = principal
        await self.sdk_app(scope, _replay(body), send)

    async def _read_body(self, request: Request) -> bytes | None:
        limit = self.settings.max_request_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)


def _missing_scope(body: bytes, scopes: frozenset[str]) -> str | None:
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None  # the SDK answers parse errors
    messages = payload if isinstance(payload, list) else [payload]
    for message in messages:
        if not isinstance(message, dict):
            continue
        method = message.get("method")
        if isinstance(method, str) and method.startswith("resources/") and SCOPE_READ not in scopes:
            return SCOPE_READ
        if method != "tools/call":
            continue
        params = message.get("params") or {}
        spec = TOOLS.get(params.get("name")) if isinstance(params, dict) else None
        if spec is not None and spec.scope not in scopes:
            return spec.scope
    return None


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    return receive
