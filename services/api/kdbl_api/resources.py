"""The MCP resources (issue 33: taken out of build_server): files and chunks as kdbl:// resources, listed by
pages (a first page that says what each source holds and how to list its chunks) and read through the same
RLS transaction and audit as every tool (kdbl_api.call_runner)."""

from __future__ import annotations

import uuid
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from pydantic import ValidationError

from kdbl_api.audit import AuditFacts
from kdbl_api.call_runner import CallRunner
from kdbl_api.tools import files
from kdbl_api.tools.blocks import text_mime_type
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import FileRefArgs
from kdbl_core.content import contents, reads
from kdbl_core.content.uris import CHUNK_PREFIX, PREFIX, chunk_uri, file_uri, parse_chunk_uri, parse_file_uri
from kdbl_core.errors import InvalidArgument

RESOURCE_PAGE = 100
CHUNKS_CURSOR = "chunks:"  # resources/list cursors that page one source's chunk resources
CHUNK_NEIGHBOURS = 1  # resources/read of a chunk: the chunks either side come with it
CHUNK_READ_CHARS = 20_000


class Resources:
    """resources/list, resources/templates/list and resources/read, run by `runner`."""

    def __init__(self, runner: CallRunner) -> None:
        self.runner = runner

    async def list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                             ) -> types.ListResourcesResult:
        cursor = params.cursor if params else None

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            codec = tctx.services.cursors
            if cursor is not None and cursor.startswith(CHUNKS_CURSOR):
                return await self._chunk_page(tctx, cursor)
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

        out = await self.runner.run(ctx, "resources/list", {"cursor": cursor}, work)
        return types.ListResourcesResult(resources=out["resources"], next_cursor=out["next"], meta=out["meta"])

    async def _chunk_page(self, tctx: ToolContext, cursor: str) -> tuple[dict[str, Any], AuditFacts]:
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

    async def list_templates(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
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

    async def read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
                            ) -> types.ReadResourceResult:
        uri = str(params.uri)
        if uri.startswith(CHUNK_PREFIX):
            return await self._read_chunk(ctx, uri)

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

        body = await self.runner.run(ctx, "resources/read", {"uri": uri}, work)
        # the text itself, typed as resources/list announces it (clients render resources by MIME type)
        meta = {k: body[k] for k in ("status", "status_reason", "content_type", "total_chunks", "truncated",
                                     "next_start")}
        meta["chunks_returned"] = len(body["chunks"])
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=uri, mime_type=text_mime_type(body["content_type"]), meta=meta,
            text="\n\n".join(c["text"] for c in body["chunks"]))])

    async def _read_chunk(self, ctx: ServerRequestContext[Any], uri: str) -> types.ReadResourceResult:
        """A kdbl://chunk/ uri: the chunk (locators in _meta), then its neighbours, each its own contents."""

        async def work(tctx: ToolContext) -> tuple[dict[str, Any], AuditFacts]:
            source_id, key, seq = parse_chunk_uri(uri)
            [item] = await contents.read(tctx.conn, [contents.Ref(source_id, key, seq, CHUNK_NEIGHBOURS)],
                                         budget=CHUNK_READ_CHARS)
            if item is None:
                raise InvalidArgument("uri", "no such chunk (or not visible to you)")
            return {"item": item, "source_id": source_id, "key": key, "seq": seq}, AuditFacts(
                source_ids=[str(source_id)], keys=[key], row_count=len(item["chunks"]))

        body = await self.runner.run(ctx, "resources/read", {"uri": uri}, work)
        item, source_id, key, seq = body["item"], body["source_id"], body["key"], body["seq"]
        out = []
        for chunk in sorted(item["chunks"], key=lambda c: (c["seq"] != seq, c["seq"])):  # the chunk first
            meta = {k: chunk[k] for k in ("seq", "page_no", "char_start", "char_end", "ts_start_ms", "ts_end_ms")}
            meta.update(role="chunk" if chunk["seq"] == seq else "neighbour", file_uri=file_uri(source_id, key),
                        total_chunks=item["total_chunks"], title=item["title"], content_type=item["content_type"])
            out.append(types.TextResourceContents(uri=chunk_uri(source_id, key, chunk["seq"]), mime_type="text/plain",
                                                  meta=meta, text=chunk["text"]))
        return types.ReadResourceResult(contents=out)

