"""search_content: three modes. lexical is the BM25 keyword arm; semantic the pgvector arm alone (hits
that share no word with the query); hybrid both arms, fused. Either mode with vectors falls back to lexical.

hybrid and semantic need an embedder in this API replica, hybrid allowed by the tenant's policy
(mcp.modes; it allows both) and enabled for the tenant, and (with a source_id filter) for that source;
otherwise the request is served lexically and says so (`degraded`, `degraded_reason`).
"""

from __future__ import annotations

from typing import Any

import anyio.to_thread
from sqlalchemy import text

from kdbl_api.audit_facts import AuditFacts
from kdbl_api.tools.context import ToolContext
from kdbl_api.tools.models import SearchContentArgs
from kdbl_core.db import reads
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import hybrid, lexical, vector
from kdbl_core.search.lexical import ChunkHit
from kdbl_core.search.windows import HitRef, expand_hits
from kdbl_core.uris import file_uri

_HYBRID_FLAGS = text("""
SELECT t.hybrid_enabled AS tenant_on,
       (SELECT s.hybrid_enabled FROM sources s WHERE s.id = CAST(:sid AS uuid)) AS source_on
  FROM tenants t WHERE t.id = kdbl_tenant()
""")


def _validate(ctx: ToolContext, args: SearchContentArgs) -> None:
    if len(args.query) > ctx.settings.max_query_chars:
        raise InvalidArgument("query", f"longer than {ctx.settings.max_query_chars} characters")
    if not args.query.strip():
        raise InvalidArgument("query", "must contain at least one non-blank character")
    if args.modified_after and args.modified_before and args.modified_after >= args.modified_before:
        raise InvalidArgument("modified_after", "must be earlier than modified_before")


async def effective_mode(ctx: ToolContext, args: SearchContentArgs) -> tuple[str, str | None]:
    """(mode to run, reason it was degraded or None)."""
    if args.mode == "lexical":
        return "lexical", None
    if "hybrid" not in ctx.policy.modes:  # the tenant's policy allows lexical search only
        return "lexical", "semantic search is not allowed for this tenant (policy: lexical only)"
    if ctx.services.embedder is None:
        return "lexical", "no embedder deployed"
    flags = (await ctx.conn.execute(_HYBRID_FLAGS, {"sid": str(args.source_id) if args.source_id else None})).one()
    if not flags.tenant_on:
        return "lexical", "hybrid is disabled for this tenant"
    if args.source_id is not None and flags.source_on is False:
        return "lexical", "hybrid is disabled for this source"
    return args.mode, None


async def _with_vectors(ctx: ToolContext, args: SearchContentArgs, mode: str, filters: lexical.Filters
                        ) -> list[hybrid.Fused]:
    """hybrid: both arms fused (and rescored); semantic: the vector arm alone, in its own order."""
    settings, embedder = ctx.settings, ctx.services.embedder
    assert embedder is not None
    depth = max(args.limit, settings.hybrid_depth)
    query_vector = await anyio.to_thread.run_sync(embedder.embed_query, args.query)
    vec = await vector.search(ctx.conn, query_vector, embedder.model_id, filters, limit=depth)
    lex: list[ChunkHit] = []
    pinned: set[int] = set()
    if mode == "hybrid":
        lex = await lexical.search(ctx.conn, args.query, filters, limit=depth, ts_config=settings.text_search_config,
                                   common_df=settings.bm25_common_df)
        terms = [t for t in await lexical.query_terms(ctx.conn, args.query, settings.text_search_config)
                 if hybrid.is_identifier(t)]
        rare = await lexical.rare_terms(ctx.conn, terms)
        pinned = await lexical.chunks_with_terms(ctx.conn, [h.chunk_id for h in lex], rare)
    fused = hybrid.fuse(lex, vec, k=settings.hybrid_rrf_k, vector_weight=settings.hybrid_vector_weight,
                        pinned_chunks=pinned)
    if mode == "hybrid" and settings.hybrid_rerank == "scores":
        ids = [f.hit.chunk_id for f in fused]
        lex_scores = {h.chunk_id: h.score for h in lex}
        vec_scores = {h.chunk_id: h.score for h in vec}
        lex_scores.update(await lexical.scores_for(ctx.conn, args.query, [i for i in ids if i not in lex_scores],
                                                   ts_config=settings.text_search_config))
        vec_scores.update(await vector.similarities(ctx.conn, query_vector, embedder.model_id,
                                                    [i for i in ids if i not in vec_scores]))
        fused = hybrid.rescore(fused, lex_scores, vec_scores, lexical_weight=settings.hybrid_rerank_lexical_weight)
    return hybrid.diversify(fused, limit=args.limit, max_per_file=settings.hybrid_max_per_file)


async def search_content(ctx: ToolContext, args: SearchContentArgs) -> tuple[dict[str, Any], AuditFacts]:
    _validate(ctx, args)
    if args.source_id is not None and await reads.get_source(ctx.conn, args.source_id) is None:
        raise InvalidArgument("source_id", f"unknown source {args.source_id} (or not visible to you)")
    filters = lexical.Filters(
        source_id=args.source_id, path=args.path, content_type=args.content_type,
        modified_after=args.modified_after, modified_before=args.modified_before,
    )
    mode, degraded_reason = await effective_mode(ctx, args)
    explanations: list[dict | None]
    if mode == "lexical":
        ranked = await lexical.search(ctx.conn, args.query, filters, limit=args.limit,
                                      ts_config=ctx.settings.text_search_config,
                                      common_df=ctx.settings.bm25_common_df)
        refs = [HitRef(h.file_id, h.source_id, h.key, h.seq, h.score) for h in ranked]
        explanations = [{"lexical_rank": i, "lexical_score": round(h.score, 6), "vector_rank": None,
                         "vector_score": None, "fused": round(h.score, 6), "pinned_identifier": False}
                        for i, h in enumerate(ranked, 1)]
    else:
        chosen = await _with_vectors(ctx, args, mode, filters)
        refs = [HitRef(f.hit.file_id, f.hit.source_id, f.hit.key, f.hit.seq, f.score) for f in chosen]
        explanations = [f.explanation() for f in chosen]
    hits = await expand_hits(ctx.conn, refs, query=args.query, ts_config=ctx.settings.text_search_config)
    explain_by_pos = {(str(r.source_id), r.key, r.seq): e for r, e in zip(refs, explanations)}
    for hit in hits:
        hit["uri"] = file_uri(hit["source_id"], hit["key"])
        hit["url"] = ctx.download_url(hit["source_id"], hit["key"])
        if args.explain:
            hit["explain"] = explain_by_pos.get((hit["source_id"], hit["key"], hit["seq"]))
    facts = AuditFacts(source_ids=[h["source_id"] for h in hits], keys=[h["key"] for h in hits],
                       row_count=len(hits), mode=mode)
    # Built as plain JSON-ready dicts, not through SearchContentResult (its validation and dump cost
    # ~0.25 ms of the API's ~6 ms per search); the tests hold every result to the tool's outputSchema.
    return {"hits": hits, "mode": mode, "degraded": degraded_reason is not None,
            "degraded_reason": degraded_reason}, facts
