"""What every part of the front door refuses with: the error rendered, the Bearer challenge, the audit row.

A refusal is a kdbl_core.errors class rendered by `jsonrpc_response_of` (its JSON-RPC code and HTTP status),
or by `http_response_of` on a plain HTTP route (/capacity). A 401 and a 403 `insufficient_scope` carry
`WWW-Authenticate: Bearer ... resource_metadata="..."` (RFC 9728: where the protected-resource metadata is).
Every refusal of a known principal writes an audit row in a transaction of its own
(kdbl_api.audit.write_alone: a failed write is logged, never answered) and logs "mcp request refused" with
the call's request id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import Response

from kdbl_api import audit, request_meta
from kdbl_api.audit import AuditFacts
from kdbl_api.call_scope import Call, CallOf
from kdbl_core.access.principal import Principal
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.errors import KdblError, http_response_of, jsonrpc_response_of
from kdbl_core.settings import Settings

log = logging.getLogger("kdbl_api.front_door")
PRM_PATH = "/.well-known/oauth-protected-resource"


def public_base(request: HTTPConnection, settings: Settings) -> str:
    if settings.api_public_url:
        return settings.api_public_url.rstrip("/")
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


def jsonrpc(exc: KdblError, headers: dict[str, str] | None = None) -> Response:
    """The error as a JSON-RPC response with its class's HTTP status (kdbl_core.errors renders both)."""
    return jsonrpc_response_of(exc, headers=headers).response()


def plain(exc: KdblError, headers: dict[str, str] | None = None) -> Response:
    """The error as a plain HTTP answer, `{"error": message, ...}` (a route that is not JSON-RPC)."""
    return http_response_of(exc, headers).response()


def disabled_message(tenant_name: str) -> str:
    return f"tenant '{tenant_name}' is disabled: its tokens are refused until an administrator enables it"


class Refusals:
    """The challenge and the audited refusal, for the parts of one front door (its settings and pool)."""

    def __init__(self, pool: AsyncPool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    def challenge(self, request: HTTPConnection, error: str | None = None, description: str | None = None,
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

    async def audit(self, request: HTTPConnection, principal: Principal, calls: Sequence[CallOf], status: str,
                    reason: str, started: float) -> None:
        """The refusal's log line and audit row (the first request's tool and arguments; else tool 'mcp')."""
        _, tool, arguments = calls[0] if calls else ("", "mcp", {})
        meta = request_meta.of_scope(request.scope)
        log.info("mcp request refused", extra={"request_id": meta.request_id if meta else None, "tool": tool,
                                               "status": status})
        await self.write(principal, audit.audit_row(principal, request, tool, arguments,
                                                    AuditFacts.refused(status, reason), started))

    async def refused(self, call: Call, status: str, reason: str,
                      calls: Sequence[CallOf] | None = None) -> None:
        """`audit` of a call the door has authenticated (its request, principal, calls and start)."""
        await self.audit(call.request, call.principal, call.calls if calls is None else calls, status, reason,
                         call.started)

    async def write(self, principal: Principal, row: dict[str, Any]) -> None:
        await audit.write_alone(self.pool, principal, row)
