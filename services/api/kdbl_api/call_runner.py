"""How one MCP call runs (issue 33: taken out of build_server): the request's principal, policy and call meta
as the front door left them on the call's one object on the scope (kdbl_api.call_scope.Call), and
`CallRunner.run` — the call's RLS transaction where the read route says (kdbl_api.read_route), its audit row,
a failure audited in a transaction of its own, the deadline, the metrics and the log line. Tools
(kdbl_api.server) and resources (kdbl_api.resources) both run through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from kdbl_api import audit, call_scope
from kdbl_api.audit import AuditFacts
from kdbl_api.call_scope import Call
from kdbl_api.observability import Observability
from kdbl_api.read_route import ReadRoute
from kdbl_api.request_meta import CallMeta
from kdbl_api.tools import blocks
from kdbl_api.tools.context import Services, ToolContext
from kdbl_core import pacing
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import Principal
from kdbl_core.db.async_pool import Connection, Statement
from kdbl_core.errors import (
    FORBIDDEN, DeadlineExceeded, Forbidden, InvalidArgument, KdblError, RateLimited, Unauthenticated,
    jsonrpc_error_of,
)

log = logging.getLogger("kdbl_api.server")  # the calls' log lines keep their logger name


@dataclass(slots=True)
class AppState:
    """Filled in by the app's lifespan (the cursor key is read from the database at start-up)."""

    services: Services | None = None
    observability: Observability = field(default_factory=Observability)


def _call_of(ctx: ServerRequestContext[Any]) -> Call | None:
    request = ctx.request
    return call_scope.of_scope(request.scope) if request is not None else None


def principal_of(ctx: ServerRequestContext[Any]) -> Principal:
    call = _call_of(ctx)
    principal = call.principal if call is not None else None
    if principal is None:  # the HTTP layer authenticates before the SDK sees the request
        raise mcp_error_of(Unauthenticated("unauthenticated"))
    return principal


def policy_of(ctx: ServerRequestContext[Any]) -> TenantPolicy:
    call = _call_of(ctx)
    return call.policy if call is not None and call.policy is not None else TenantPolicy()


def meta_of(ctx: ServerRequestContext[Any]) -> CallMeta:
    """The call's CallMeta, opened by the front door (one of its own when the door did not run)."""
    request = ctx.request
    if request is None:
        return CallMeta.begin()
    call = call_scope.of_scope(request.scope)
    if call is None:
        call = request.scope[call_scope.KEY] = Call(CallMeta.begin())
    return call.meta


def rendering_of(ctx: ServerRequestContext[Any]) -> blocks.Rendering:
    """What this request's client reads (kdbl_api.tools.blocks): its protocol and X-Kdbl-Text-Block."""
    request = ctx.request
    return blocks.rendering(request.headers if request is not None else None)


def progress_of(ctx: ServerRequestContext[Any]) -> Callable[[str, float, float | None], Awaitable[None]] | None:
    """Sends a notifications/progress on the request's own stream, when the client sent a progress token
    (the front door then answers on SSE: kdbl_api.front_door.dispatch); None without one."""
    if not ctx.meta or ctx.meta.get("progress_token") is None:
        return None

    async def send(message: str, progress: float, total: float | None) -> None:
        meta_of(ctx).progressed = True
        await ctx.session.report_progress(progress, total, message)

    return send


def _status(exc: KdblError | MCPError) -> str:
    if isinstance(exc, Forbidden) or (isinstance(exc, MCPError) and exc.error.code == FORBIDDEN):
        return "denied"
    if isinstance(exc, RateLimited):
        return "rate_limited"
    if isinstance(exc, DeadlineExceeded):
        return "timeout"
    return "error"


def mcp_error_of(exc: KdblError) -> MCPError:
    """A KdblError as the SDK's MCPError: the JSON-RPC error object kdbl_core.errors renders."""
    error = jsonrpc_error_of(exc)
    return MCPError(error["code"], error["message"], error.get("data"))


def validation_error(exc: ValidationError) -> MCPError:
    first = exc.errors()[0]
    field_name = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unknown argument"
    elif first.get("type") == "missing":
        message = "required argument is missing"
    return mcp_error_of(InvalidArgument(field_name, message))


Work = Callable[[ToolContext], Awaitable[tuple[dict[str, Any], AuditFacts]]]


class CallRunner:
    """Runs MCP calls over `route` with the app's `state` (services, observability)."""

    def __init__(self, route: ReadRoute, state: AppState) -> None:
        self.route = route
        self.state = state

    async def run(self, ctx: ServerRequestContext[Any], name: str, arguments: dict[str, Any], work: Work,
                  opening: Callable[[], Statement | None] | None = None) -> dict[str, Any]:
        """The call in its RLS transaction (where self.route reads), audited; a failure audited on its own."""
        route, state = self.route, self.state
        principal = principal_of(ctx)
        assert state.services is not None, "app lifespan did not run"
        started = time.perf_counter()
        meta = meta_of(ctx)
        ok, mode = False, None
        policy = policy_of(ctx)

        def exceeded(where: str) -> None:
            state.observability.deadline_exceeded.labels(name, where).inc()

        services = state.services

        async def body(conn: Connection, opened: Statement | None) -> tuple[dict[str, Any], AuditFacts]:
            tctx = ToolContext(conn=conn, principal=principal, services=services, policy=policy, meta=meta,
                               opened=opened)
            parts = len(meta.took_ms)
            result, facts = await work(tctx)
            if len(meta.took_ms) == parts:  # the handler did not break its time down: its reads
                meta.add("db", started)
            return result, facts

        try:
            opened = opening() if opening is not None else None  # may refuse the arguments: audited below
            result, facts = await route.run(
                principal, tool=name, deadline_ms=policy.limits.deadline_ms(name),
                extra_s=services.settings.chat_timeout_s if name == "answer" else 0.0, opened=opened, body=body,
                row_of=lambda facts: audit.audit_row(principal, ctx.request, name, arguments, facts, started),
                rerunnable=lambda: not meta.progressed, on_exceeded=exceeded)
            ok, mode = True, facts.mode
            await pacing.checkpoint()  # its connection is back; the result's rendering may wait its turn
            return result
        except KdblError as exc:
            await self.audit_failure(ctx, principal, name, arguments, _status(exc), exc.message, started)
            raise mcp_error_of(exc) from None
        except MCPError as exc:
            await self.audit_failure(ctx, principal, name, arguments, _status(exc), exc.error.message, started)
            raise
        except Exception as exc:  # unexpected: audited by its type only (the message may hold internals)
            internal = f"internal error ({type(exc).__name__})"
            await self.audit_failure(ctx, principal, name, arguments, "error", internal, started)
            # the SDK would send str(exc) with code 0; the caller gets -32603 and no internals
            log.exception("tool call failed unexpectedly", extra={"tool": name, "request_id": meta.request_id})
            raise mcp_error_of(KdblError(f"internal error in {name}; the server logged it")) from None
        finally:
            seconds = time.perf_counter() - started
            state.observability.record_call(name, "ok" if ok else "error", seconds, mode)
            log.info("mcp call", extra={"request_id": meta.request_id, "tool": name, "status": "ok" if ok else "error",
                                        "took_ms": round((time.perf_counter() - meta.started) * 1000, 3)})

    async def audit_failure(self, ctx: ServerRequestContext[Any], principal: Principal, tool: str,
                            arguments: dict[str, Any], status: str, reason: str, started: float) -> None:
        """A refused or failed call's row, in a transaction of its own on the primary."""
        facts = AuditFacts.refused(status, reason)
        row = audit.audit_row(principal, ctx.request, tool, arguments, facts, started)
        await audit.write_alone(self.route.primary, principal, row)

