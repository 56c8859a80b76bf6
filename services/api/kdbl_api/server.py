"""The MCP server (official SDK, low-level Server): tools and resources over RLS transactions.

Every call — tool or resource — runs in one RLS transaction for the caller's principal, writes one
audit row from the facts its handler returns (kdbl_api.audit; a failed call is audited in its
own transaction, an unexpected failure too), and is counted in the metrics. The tenant's policy (put
in the request scope by the front door) limits the tools listed and callable: a tool outside its
allowlist is refused exactly as an unknown tool. Scopes are checked once, by the front door
(kdbl_api.scope_check), before the SDK parses the request.

Every call has a deadline (its tenant's per tool, else KDBL_CALL_TIMEOUT_S; kdbl_api.deadlines): past it
the server cancels its statement, or Python the call, the transaction is rolled back and the caller gets
DeadlineExceeded (-32008) saying what to change, audited `timeout` in a transaction of its own.

Every tool result carries `meta` (kdbl_api.request_meta): the call's request id, its time by part and
whether a cache answered; the same id is in the call's audit row and its one JSON log line ("mcp call":
request_id, tool, status, took_ms).
"""

from __future__ import annotations

import time
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from pydantic import ValidationError

from kdbl_api.audit import AuditFacts
from kdbl_api.call_runner import (
    AppState, CallRunner, mcp_error_of, meta_of, policy_of, principal_of, progress_of, rendering_of, validation_error,
)
from kdbl_api.read_route import ReadRoute
from kdbl_api.resources import Resources
from kdbl_api.tools import blocks
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.registry import TOOLS
from kdbl_core import __version__
from kdbl_core.db.async_pool import Statement
from kdbl_core.errors import InvalidArgument

__all__ = ["AppState", "build_server", "mcp_error_of"]

INSTRUCTIONS = (
    "K-Lake serves the documents your organisation indexed. Loop: 1) locate with search_content, leading "
    "with distinctive terms, reformulating in the corpus's own words if the first hits do not answer; "
    "2) read from each hit's text, or get_file_window around the hit's seq for more; 3) answer grounded in "
    "what you read, citing the kdbl://file/... uri (and url, when present) of every source. If nothing "
    "answers, say so — do not fall back to prior knowledge."
)


def build_server(route: ReadRoute, state: AppState) -> Server[Any]:
    """The SDK server over `route` (kdbl_api.read_route: where calls read, audit rows on the primary): the
    tools here, the resources in kdbl_api.resources, each call run by kdbl_api.call_runner."""
    definitions = [spec.definition() for spec in TOOLS.values()]
    runner = CallRunner(route, state)
    resources = Resources(runner)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        allowed, how = policy_of(ctx).tools, rendering_of(ctx)
        return types.ListToolsResult(tools=[blocks.listed(_offered(d), how) for d in definitions if d.name in allowed])

    def _offered(tool: types.Tool) -> types.Tool:
        """The tool as this server offers it (registry.ToolSpec.offered: answer without a chat model)."""
        offered = TOOLS[tool.name].offered
        return tool if offered is None or state.services is None else offered(state.services, tool)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        spec = TOOLS.get(params.name) if policy_of(ctx).allows_tool(params.name) else None
        arguments = params.arguments or {}
        if spec is None:
            error = mcp_error_of(InvalidArgument("name", f"unknown tool '{params.name}'"))
            await runner.audit_failure(ctx, principal_of(ctx), str(params.name)[:200], arguments, "error",
                                 error.error.message, time.perf_counter())
            raise error

        parsed: list[Any] = []

        def validated() -> Any:
            if not parsed:
                try:
                    parsed.append(spec.args.model_validate(arguments))
                except ValidationError as exc:
                    raise validation_error(exc) from None
            return parsed[0]

        def opening() -> Statement | None:
            assert spec is not None and spec.opening is not None and state.services is not None
            return spec.opening(state.services, policy_of(ctx), validated())

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            tctx.progress = progress_of(ctx)
            return await spec.handler(tctx, validated())

        structured = await runner.run(ctx, spec.name, arguments, work, opening if spec.opening is not None else None)
        structured.pop("meta", None)  # last in the result, after the reference's fields
        structured["meta"] = meta_of(ctx).as_json()
        return blocks.tool_result(structured, rendering_of(ctx), links=spec.links, own=spec.own_blocks)

    return Server(
        "kdbl-context-lake", version=__version__, title="K-Lake", instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=resources.list_resources,
        on_list_resource_templates=resources.list_templates, on_read_resource=resources.read_resource,
    )

