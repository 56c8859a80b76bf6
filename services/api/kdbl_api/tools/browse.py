"""Browsing the catalogue: list_sources and list_files, keyset-paginated with signed cursors."""

from __future__ import annotations

import uuid
from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import ListFilesArgs, ListFilesResult, ListSourcesArgs, ListSourcesResult
from kdbl_core.content import reads, vectors
from kdbl_core.content.uris import file_uri
from kdbl_core.errors import InvalidArgument


async def list_sources(ctx: ToolContext, args: ListSourcesArgs) -> tuple[dict[str, Any], AuditFacts]:
    after = None
    if args.cursor is not None:
        pos = ctx.services.cursors.decode(args.cursor, ctx.principal, "sources")
        after = (pos["name"], uuid.UUID(pos["id"]))
    rows = await reads.list_sources(ctx.conn, after=after, limit=args.limit + 1)
    page, more = rows[:args.limit], len(rows) > args.limit
    embedder = ctx.services.embedder
    model_id = embedder.model_id if embedder else None
    progress = await vectors.source_progress(ctx.conn, [r["id"] for r in page], model_id)
    backlog = await vectors.backlog(ctx.conn, model_id) if page else {}
    next_cursor = None
    if more:
        last = page[-1]
        next_cursor = ctx.services.cursors.encode(ctx.principal, "sources", {"name": last["name"],
                                                                             "id": str(last["id"])})

    def embedding(r: dict[str, Any]) -> dict[str, Any]:
        counts = progress.get(r["id"], {"embedded": 0, "total": 0})
        active = bool(embedder and r["hybrid_enabled"])
        eta = None if not active else 0.0 if counts["embedded"] >= counts["total"] else backlog.get("eta_s")
        return {**counts, "active": active, "chunks_per_s": backlog.get("chunks_per_s") if active else None,
                "eta_s": eta}

    return ListSourcesResult(sources=[{
        "source_id": str(r["id"]), "name": r["name"], "protocol": r["protocol"], "enabled": r["enabled"],
        "hybrid_enabled": r["hybrid_enabled"], "last_indexed_at": r["last_indexed_at"],
        "file_count": r["file_count"], "embedding": embedding(r),
    } for r in page], next_cursor=next_cursor).model_dump(mode="json"), AuditFacts(
        source_ids=[str(r["id"]) for r in page], row_count=len(page))


async def list_files(ctx: ToolContext, args: ListFilesArgs) -> tuple[dict[str, Any], AuditFacts]:
    if await reads.get_source(ctx.conn, args.source_id) is None:
        raise InvalidArgument("source_id", f"unknown source {args.source_id} (or not visible to you)")
    listing = f"files:{args.source_id}"
    after = ""
    if args.cursor is not None:
        after = ctx.services.cursors.decode(args.cursor, ctx.principal, listing)["key"]
    rows = await reads.list_files(ctx.conn, args.source_id, after_key=after, limit=args.limit + 1)
    page, more = rows[:args.limit], len(rows) > args.limit
    return ListFilesResult(
        source_id=str(args.source_id),
        files=[{"key": r["key"], "uri": file_uri(args.source_id, r["key"]), "size": r["size"], "mtime": r["mtime"],
                "content_type": r["content_type"], "status": r["status"], "total_chunks": r["chunk_count"]}
               for r in page],
        next_cursor=ctx.services.cursors.encode(ctx.principal, listing, {"key": page[-1]["key"]}) if more else None,
    ).model_dump(mode="json"), AuditFacts(source_ids=(str(args.source_id),), keys=[r["key"] for r in page],
                                          row_count=len(page))
