"""The one typed object a call carries on its ASGI scope, from the /mcp front door to the tool's audit row.

The front door (kdbl_api.front_door: small ASGI parts in a stack) opens a `Call` under one scope key and each
part fills in what it found out — the request meta (request id, timings), the verified token, the tenant's
policy, the body and the message it parsed, the rate-limit decision — instead of one scope key per fact.
The MCP handlers read it back (kdbl_api.call_runner: `principal_of`, `policy_of`, `meta_of`); the audit row
reads the meta through kdbl_api.request_meta.of_scope (that module owns the key, as it sits below this one).
`scope["user"]` and `scope["auth"]` are still set (kdbl_api.bearer.authenticated) because the SDK reads them.

An in-process caller that reads one JSON body, never an SSE stream (kdbl_api.legacy_sse), leaves a `Call`
with `json_only` on the scope before it sends the request through the door, which keeps that wish.

It lives here, below kdbl_api.call_runner, and not in the front door's package: the handlers read it, and the
API's layers (pyproject.toml) let them import nothing above call_runner. Cost: one slotted dataclass per call
(~0.3 µs to build; its fields are the objects the door made anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import Scope

from kdbl_api.bearer import PrincipalToken
from kdbl_api.ratelimit import Decision
from kdbl_api.request_meta import SCOPE_KEY, CallMeta
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import Principal

KEY = SCOPE_KEY  # scope[KEY]: the call's Call

CallOf = tuple[str, str, Any]  # (method, tool name or method, arguments) of one JSON-RPC request


@dataclass(slots=True)
class Call:
    """What the front door learned about one request, in the order its parts learn it."""

    meta: CallMeta  # the request id and where the time went (kdbl_api.request_meta)
    request: Request | None = None  # the door's one Starlette Request (headers, body stream, client address);
    # dropped when the door is done (it refers to the scope, which refers to this)
    json_only: bool = False  # answer with one JSON body even when the call asks for progress
    started: float = 0.0  # perf_counter when the door's checks began: the refusals' audit rows time from here
    access: PrincipalToken | None = None  # the verified token (kdbl_api.bearer), carrying the principal
    policy: TenantPolicy | None = None  # the tenant's policy (kdbl_core.access.policy)
    body: bytes = b""  # the body as read; the SDK gets it replayed
    message: dict[str, Any] | None = None  # the body's JSON-RPC message, parsed once
    calls: Sequence[CallOf] = ()  # the message's request, if it is one (not a notification or a reply)
    decision: Decision | None = None  # the rate limiter's; None: the call took none, or no tier applies

    @property
    def principal(self) -> Principal | None:
        return self.access.principal if self.access is not None else None


def of_scope(scope: Scope | None) -> Call | None:
    """The call the front door opened on this scope (None where no door ran: stdio, a download)."""
    return scope.get(KEY) if scope is not None else None
