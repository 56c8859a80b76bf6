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

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from kdbl_api import audit, bearer, request_meta
from kdbl_api.audit import AuditFacts
from kdbl_api.read_route import ReadRoute
from kdbl_api.observability import Observability
from kdbl_api.request_meta import CallMeta
from kdbl_api.tools import blocks, files
from kdbl_api.tools.blocks import text_mime_type
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import FileRefArgs
from kdbl_api.tools.registry import TOOLS
from kdbl_core import __version__, pacing
from kdbl_core.content import contents, reads
from kdbl_core.db.async_pool import Connection, Statement
from kdbl_core.errors import (
    FORBIDDEN, DeadlineExceeded, Forbidden, InvalidArgument, KdblError, RateLimited, Unauthenticated,
    jsonrpc_error_of,
)
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import Principal
from kdbl_core.content.uris import CHUNK_PREFIX, PREFIX, chunk_uri, file_uri, parse_chunk_uri, parse_file_uri

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "K-Lake serves the documents your organisation indexed. Loop: 1) locate with search_content, leading "
    "with distinctive terms, reformulating in the corpus's own words if the first hits do not answer; "
    "2) read from each hit's text, or get_file_window around the hit's seq for more; 3) answer grounded in "
    "what you read, citing the kdbl://file/... uri (and url, when present) of every source. If nothing "
    "answers, say so — do not fall back to prior knowledge."
)
POLICY_KEY = "kdbl.policy"
RESOURCE_PAGE = 100
CHUNKS_CURSOR = "chunks:"  # resources/list cursors that page one source's chunk resources
CHUNK_NEIGHBOURS = 1  # resources/read of a chunk: the chunks either side come with it
CHUNK_READ_CHARS = 20_000


@dataclass(slots=True)
class AppState:
    """Filled in by the app's lifespan (the cursor key is read from the database at start-up)."""

    services: Services | None = None
    observability: Observability = field(default_factory=Observability)


def _principal(ctx: ServerRequestContext[Any]) -> Principal:
    request = ctx.request
    principal = bearer.principal_in(request.scope) if request is not None else None
    if principal is None:  # the HTTP layer authenticates before the SDK sees the request
        raise mcp_error_of(Unauthenticated("unauthenticated"))
    return principal


def _policy(ctx: ServerRequestContext[Any]) -> TenantPolicy:
    request = ctx.request
    found = request.scope.get(POLICY_KEY) if request is not None else None
    return found if found is not None else TenantPolicy()


def _meta(ctx: ServerRequestContext[Any]) -> CallMeta:
    """The call's CallMeta, opened by the front door (one of its own when the door did not run)."""
    request = ctx.request
    if request is None:
        return CallMeta.begin()
    found = request_meta.of_scope(request.scope)
    if found is None:
        found = request.scope[request_meta.SCOPE_KEY] = CallMeta.begin()
    return found


def _rendering(ctx: ServerRequestContext[Any]) -> blocks.Rendering:
    """What this request's client reads (kdbl_api.tools.blocks): its protocol and X-Kdbl-Text-Block."""
    request = ctx.request
    return blocks.rendering(request.headers if request is not None else None)


def _progress(ctx: ServerRequestContext[Any]) -> Callable[[str, float, float | None], Awaitable[None]] | None:
    """Sends a notifications/progress on the request's own stream, when the client sent a progress token
    (the front door then answers on SSE: kdbl_api.http_auth); None without one."""
    if not ctx.meta or ctx.meta.get("progress_token") is None:
        return None

    async def send(message: str, progress: float, total: float | None) -> None:
        _meta(ctx).progressed = True
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


def build_server(route: ReadRoute, state: AppState) -> Server[Any]:
    """The SDK server over `route` (kdbl_api.read_route: where calls read, audit rows on the primary)."""
    definitions = [spec.definition() for spec in TOOLS.values()]
    pool = route.primary

    async def run(ctx: ServerRequestContext[Any], name: str, arguments: dict[str, Any], work: Work,
                  opening: Callable[[], Statement | None] | None = None) -> dict[str, Any]:
        principal = _principal(ctx)
        assert state.services is not None, "app lifespan did not run"
        started = time.perf_counter()
        meta = _meta(ctx)
        ok, mode = False, None
        policy = _policy(ctx)

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
            await _audit_failure(ctx, principal, name, arguments, _status(exc), exc.message, started)
            raise mcp_error_of(exc) from None
        except MCPError as exc:
            await _audit_failure(ctx, principal, name, arguments, _status(exc), exc.error.message, started)
            raise
        except Exception as exc:  # unexpected: audited by its type only (the message may hold internals)
            internal = f"internal error ({type(exc).__name__})"
            await _audit_failure(ctx, principal, name, arguments, "error", internal, started)
            # the SDK would send str(exc) with code 0; the caller gets -32603 and no internals
            log.exception("tool call failed unexpectedly", extra={"tool": name, "request_id": meta.request_id})
            raise mcp_error_of(KdblError(f"internal error in {name}; the server logged it")) from None
        finally:
            seconds = time.perf_counter() - started
            state.observability.record_call(name, "ok" if ok else "error", seconds, mode)
            log.info("mcp call", extra={"request_id": meta.request_id, "tool": name, "status": "ok" if ok else "error",
                                        "took_ms": round((time.perf_counter() - meta.started) * 1000, 3)})

    async def _audit_failure(ctx: ServerRequestContext[Any], principal: Principal, tool: str,
                             arguments: dict[str, Any], status: str, reason: str, started: float) -> None:
        facts = AuditFacts.refused(status, reason)
        row = audit.audit_row(principal, ctx.request, tool, arguments, facts, started)
        await audit.write_alone(pool, principal, row)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                         ) -> types.ListToolsResult:
        allowed, how = _policy(ctx).tools, _rendering(ctx)
        return types.ListToolsResult(tools=[blocks.listed(_offered(d), how) for d in definitions if d.name in allowed])

    def _offered(tool: types.Tool) -> types.Tool:
        """The tool as this server offers it (registry.ToolSpec.offered: answer without a chat model)."""
        offered = TOOLS[tool.name].offered
        return tool if offered is None or state.services is None else offered(state.services, tool)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        spec = TOOLS.get(params.name) if _policy(ctx).allows_tool(params.name) else None
        arguments = params.arguments or {}
        if spec is None:
            error = mcp_error_of(InvalidArgument("name", f"unknown tool '{params.name}'"))
            await _audit_failure(ctx, _principal(ctx), str(params.name)[:200], arguments, "error",
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
            return spec.opening(state.services, _policy(ctx), validated())

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            tctx.progress = _progress(ctx)
            return await spec.handler(tctx, validated())

        structured = await run(ctx, spec.name, arguments, work, opening if spec.opening is not None else None)
        structured.pop("meta", None)  # last in the result, after the reference's fields
        structured["meta"] = _meta(ctx).as_json()
        return blocks.tool_result(structured, _rendering(ctx), links=spec.links, own=spec.own_blocks)

    async def list_resources(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        cursor = params.cursor if params else None

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            codec = tctx.services.cursors
            if cursor is not None and cursor.startswith(CHUNKS_CURSOR):
                return await _chunk_page(tctx, cursor)
            after = None
            if cursor is not None:
                pos = codec.decode(cursor, tctx.principal, "resources")
                after = (pos["s"], pos["k"])
            rows = await reads.list_all_files(tctx.conn, after=after, limit=RESOURCE_PAGE + 1)
            page = rows[:RESOURCE_PAGE]
            nxt = None
            if len(rows) > RESOURCE_PAGE:
                nxt = codec.encode(tctx.principal, "resources", {"s": str(page[-1]["source_id"]), "k": page[-1]["key"]})
            resources = [types.Resource(
                uri=file_uri(r["source_id"], r["key"]), name=r["key"], title=r["title"],
                description=f"extracted text of a {r['content_type'] or 'file'} of {r['size'] or 0} bytes",
                mime_type=text_mime_type(r["content_type"])) for r in page]
            meta = None
            if cursor is None:  # the first page says what each source holds, and how to list its chunks
                meta = {"kdbl/sources": [
                    {"source_id": str(c["source_id"]), "name": c["name"], "files": c["files"],
                     "chunks": int(c["chunks"]), "chunks_cursor": CHUNKS_CURSOR + codec.encode(
                         tctx.principal, "resources:chunks", {"s": str(c["source_id"]), "k": "", "q": -1})}
                    for c in await reads.source_resource_counts(tctx.conn)]}
            return {"resources": resources, "next": nxt, "meta": meta}, AuditFacts(row_count=len(page))

        out = await run(ctx, "resources/list", {"cursor": cursor}, work)
        return types.ListResourcesResult(resources=out["resources"], next_cursor=out["next"], meta=out["meta"])

    async def _chunk_page(tctx: ToolContext, cursor: str) -> tuple[dict[str, Any], AuditFacts]:
        """One page of a source's chunk resources (the cursor from the first page's kdbl/sources)."""
        pos = tctx.services.cursors.decode(cursor[len(CHUNKS_CURSOR):], tctx.principal, "resources:chunks")
        source_id = uuid.UUID(pos["s"])
        rows = await reads.list_source_chunks(tctx.conn, source_id, after=(pos["k"], pos["q"]),
                                              limit=RESOURCE_PAGE + 1)
        page = rows[:RESOURCE_PAGE]
        nxt = None
        if len(rows) > RESOURCE_PAGE:
            nxt = CHUNKS_CURSOR + tctx.services.cursors.encode(tctx.principal, "resources:chunks", {
                "s": str(source_id), "k": page[-1]["key"], "q": page[-1]["seq"]})
        resources = [types.Resource(
            uri=chunk_uri(source_id, r["key"], r["seq"]), name=f"{r['key']}#{r['seq']}", title=r["title"],
            description=f"chunk {r['seq']} of a {r['content_type'] or 'file'}: {r['chars']} characters"
                        + (f", page {r['page_no']}" if r["page_no"] is not None else ""),
            mime_type="text/plain") for r in page]
        return {"resources": resources, "next": nxt, "meta": None}, AuditFacts(
            source_ids=[str(source_id)], row_count=len(page))

    async def list_templates(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            uri_template=PREFIX + "{source_id}/{key}", name="file", title="Indexed file",
            description=("A file's extracted text (get_file_text's text, as text/markdown for markdown files, "
                         "else text/plain; status and truncation in _meta); url-encode both parts."),
            mime_type="text/plain"), types.ResourceTemplate(
            uri_template=CHUNK_PREFIX + "{source_id}/{key}/{seq}", name="chunk", title="One chunk of a file",
            description=("A chunk (a search hit's chunk_uri) with its locators in _meta, then the chunks either "
                         "side of it, each with its own uri; url-encode source_id and key."),
            mime_type="text/plain")])

    async def read_resource(ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri.startswith(CHUNK_PREFIX):
            return await _read_chunk(ctx, uri)

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            source_id, key = parse_file_uri(uri)
            try:
                ref = FileRefArgs(source_id=source_id, key=key)
            except ValidationError as exc:
                raise InvalidArgument("uri", f"bad key part: {exc.errors()[0].get('msg', 'invalid')}") from None
            try:
                return await files.file_text(tctx, ref)
            except InvalidArgument as exc:  # the only argument is the uri: name it
                raise InvalidArgument("uri", exc.reason) from None

        body = await run(ctx, "resources/read", {"uri": uri}, work)
        # the text itself, typed as resources/list announces it (clients render resources by MIME type)
        meta = {k: body[k] for k in ("status", "status_reason", "content_type", "total_chunks", "truncated",
                                     "next_start")}
        meta["chunks_returned"] = len(body["chunks"])
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type=text_mime_type(body["content_type"]), meta=meta,
            text="\n\n".join(c["text"] for c in body["chunks"]))])

    async def _read_chunk(ctx: ServerRequestContext[Any], uri: str) -> types.ReadResourceResult:
        """A kdbl://chunk/ uri: the chunk (locators in _meta), then its neighbours, each its own contents."""

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            source_id, key, seq = parse_chunk_uri(uri)
            [item] = await contents.read(tctx.conn, [contents.Ref(source_id, key, seq, CHUNK_NEIGHBOURS)],
                                         budget=CHUNK_READ_CHARS)
            if item is None:
                raise InvalidArgument("uri", "no such chunk (or not visible to you)")
            return {"item": item, "source_id": source_id, "key": key, "seq": seq}, AuditFacts(
                source_ids=[str(source_id)], keys=[key], row_count=len(item["chunks"]))

        body = await run(ctx, "resources/read", {"uri": uri}, work)
        item, source_id, key, seq = body["item"], body["source_id"], body["key"], body["seq"]
        out = []
        for chunk in sorted(item["chunks"], key=lambda c: (c["seq"] != seq, c["seq"])):  # the chunk first
            meta = {k: chunk[k] for k in ("seq", "page_no", "char_start", "char_end", "ts_start_ms", "ts_end_ms")}
            meta.update(role="chunk" if chunk["seq"] == seq else "neighbour", file_uri=file_uri(source_id, key),
                        total_chunks=item["total_chunks"], title=item["title"], content_type=item["content_type"])
            out.append(types.TextResourceContents(uri=chunk_uri(source_id, key, chunk["seq"]), mime_type="text/plain",
                                                  meta=meta, text=chunk["text"]))
        return types.ReadResourceResult(contents=out)

    return Server(
        "kdbl-context-lake", version=__version__, title="K-Lake", instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources,
        on_list_resource_templates=list_templates, on_read_resource=read_resource,
    )

