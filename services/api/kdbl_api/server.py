"""The MCP server (official SDK, low-level Server): tools/list and tools/call over RLS transactions."""

from __future__ import annotations

import logging
import time
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.registry import TOOLS, content_blocks
from kdbl_core import __version__
from kdbl_core.db import audit
from kdbl_core.db.engine import rls_transaction
from kdbl_core.errors import INVALID_PARAMS, Forbidden, KdblError
from kdbl_core.principal import Principal
from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "K-Lake serves the documents your organisation indexed. Loop: 1) locate with search_content, leading "
    "with distinctive terms, reformulating in the corpus's own words if the first hits do not answer; "
    "2) read from each hit's text, or get_file_text for the whole document; 3) answer grounded in what "
    "you read, citing the kdbl://file/... uri of every source. If nothing answers, say so."
)
PRINCIPAL_KEY = "kdbl.principal"


def _principal(ctx: ServerRequestContext[Any]) -> Principal:
    request = ctx.request
    principal = request.scope.get(PRINCIPAL_KEY) if request is not None else None
    if principal is None:  # the HTTP layer authenticates before the SDK sees the request
        raise MCPError(-32001, "unauthenticated")
    return principal


def _client_ip(ctx: ServerRequestContext[Any]) -> str | None:
    request = ctx.request
    client = getattr(request, "client", None)
    return client.host if client else None


def validation_error(exc: ValidationError) -> MCPError:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unknown argument"
    elif first.get("type") == "missing":
        message = "required argument is missing"
    return MCPError(INVALID_PARAMS, f"invalid argument '{field}': {message}", {"field": field})


def build_server(engine: AsyncEngine, settings: Settings) -> Server[Any]:
    definitions = [spec.definition() for spec in TOOLS.values()]

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=definitions)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        principal = _principal(ctx)
        spec = TOOLS.get(params.name)
        if spec is None:
            raise MCPError(INVALID_PARAMS, f"invalid argument 'name': unknown tool '{params.name}'",
                           {"field": "name"})
        arguments = params.arguments or {}
        started = time.perf_counter()
        tctx: ToolContext | None = None
        try:
            if not principal.has_scope(spec.scope):
                raise Forbidden(f"token lacks scope '{spec.scope}' required by {spec.name}",
                                data={"required_scope": spec.scope})
            try:
                args = spec.args.model_validate(arguments)
            except ValidationError as exc:
                raise validation_error(exc) from None
            async with rls_transaction(engine, principal) as conn:
                tctx = ToolContext(conn=conn, principal=principal, settings=settings)
                structured = await spec.handler(tctx, args)
                await _audit(conn, tctx, principal, spec.name, arguments, "ok", None, _client_ip(ctx), started)
        except KdblError as exc:
            await _audit_failure(engine, principal, spec.name, arguments, exc.message, ctx, started)
            raise MCPError(exc.jsonrpc_code, exc.message, exc.data or None) from None
        except MCPError as exc:
            await _audit_failure(engine, principal, spec.name, arguments, exc.message, ctx, started)
            raise
        return types.CallToolResult(content=content_blocks(spec, structured), structured_content=structured)

    return Server(
        "kdbl-context-lake", version=__version__, title="K-Lake", instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=call_tool,
    )


async def _audit(conn: Any, tctx: ToolContext | None, principal: Principal, tool: str, arguments: dict[str, Any],
                 status: str, error: str | None, client_ip: str | None, started: float) -> None:
    await audit.record(
        conn, tenant_id=principal.tenant_id, principal=principal.subject, token_id=principal.token_id,
        tool=tool, arguments=arguments, source_ids=tctx.source_ids if tctx else [],
        keys=tctx.keys if tctx else [], row_count=tctx.row_count if tctx else 0, status=status, error=error,
        client_ip=client_ip, duration_ms=(time.perf_counter() - started) * 1000,
    )


async def _audit_failure(engine: AsyncEngine, principal: Principal, tool: str, arguments: dict[str, Any],
                         error: str, ctx: ServerRequestContext[Any], started: float) -> None:
    try:
        async with rls_transaction(engine, principal) as conn:
            await _audit(conn, None, principal, tool, arguments, "error", error, _client_ip(ctx), started)
    except Exception:  # noqa: BLE001 - never mask the caller's error with an audit failure
        log.exception("audit write failed", extra={"tool": tool})
