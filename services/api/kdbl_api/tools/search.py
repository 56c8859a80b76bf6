"""search_content: BM25 keyword search (hybrid degrades to lexical until an embedder is deployed)."""

from __future__ import annotations

from typing import Any

from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import SearchContentArgs, SearchContentResult
from kdbl_core.db import reads
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import lexical
from kdbl_core.search.windows import HitRef, expand_hits
from kdbl_core.uris import file_uri


async def search_content(ctx: ToolContext, args: SearchContentArgs) -> dict[str, Any]:
    if len(args.query) > ctx.settings.max_query_chars:
        raise InvalidArgument("query", f"longer than {ctx.settings.max_query_chars} characters")
    if not args.query.strip():
        raise InvalidArgument("query", "must contain at least one non-blank character")
    if (args.modified_after and args.modified_before and args.modified_after >= args.modified_before):
        raise InvalidArgument("modified_after", "must be earlier than modified_before")
    if args.source_id is not None and await reads.get_source(ctx.conn, args.source_id) is None:
        raise InvalidArgument("source_id", f"unknown source {args.source_id} (or not visible to you)")

    filters = lexical.Filters(
        source_id=args.source_id, path=args.path, content_type=args.content_type,
        modified_after=args.modified_after, modified_before=args.modified_before,
    )
    ranked = await lexical.search(ctx.conn, args.query, filters, limit=args.limit,
                                  ts_config=ctx.settings.text_search_config)
    refs = [HitRef(h.file_id, h.source_id, h.key, h.seq, h.score) for h in ranked]
    hits = await expand_hits(ctx.conn, refs, query=args.query, ts_config=ctx.settings.text_search_config)
    for hit in hits:
        hit["uri"] = file_uri(hit["source_id"], hit["key"])
        hit["url"] = ctx.download_url(hit["source_id"], hit["key"])
        ctx.source_ids.append(hit["source_id"])
        ctx.keys.append(hit["key"])
    ctx.row_count = len(hits)
    ctx.mode = "lexical"
    result = SearchContentResult(hits=hits, mode="lexical", degraded=args.mode == "hybrid")
    return result.model_dump(mode="json")
