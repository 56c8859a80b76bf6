"""search_content: validates the arguments once, makes the call's search plan (kdbl_core.search.plan:
its preflight, the mode, then the pipeline — both arms, fusion, pinning, rerank, diversification, windows,
snippets) and adds each hit's URI and signed download link. The tenant's policy (mcp.modes) decides
whether vectors may serve it. With `response_mode` / `fields` the hits are cut to the mode's fields
(kdbl_api.tools.hit_fields); without them they keep the reference's shape.

One plan per call (issue 33): the registry's opening hook (`opening`) validates the arguments and makes
the plan, whose opening statement (the preflight) rides with the call's BEGIN and leads the handler back
to it (a retry's copy too); a handler called without an opening makes its own, validating there instead.

Pages and the cache (issue 16): the plan's preflight also reads the index state (issue 28: of what the
serving mode's result depends on, `plan.state`); a `cursor` (kdbl_core.search.paging) must be this
principal's, for this query, cut from this state, and gives the page's offset; a result cached for this
principal, these arguments and this state (kdbl_core.search.cache, per process) answers without searching
(meta.cache_hit). Every page says has_more, next_cursor, total_available (exact or a lower bound) and
whether paging hit the cap.
"""

from __future__ import annotations

from typing import Any

from kdbl_api.audit import AuditFacts
from kdbl_api.tools import hit_fields
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import SearchContentArgs
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.content.uris import file_uri
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import paging, pipeline
from kdbl_core.search.plan import Opening, SearchPlan
from kdbl_core.search.windows import hit_facts
from kdbl_core.settings import Settings


def _validate(settings: Settings, args: SearchContentArgs) -> tuple[str, ...] | None:
    """Raises InvalidArgument for a broken argument; returns the response mode's hit fields (None: classic)."""
    pipeline.check_query(args.query, settings)  # the filters' consistency: SearchFilters' own validator
    chosen = hit_fields.selection(args.response_mode, args.fields)
    if chosen is not None and args.explain:
        raise InvalidArgument("explain", "applies to classic hits; with response_mode ask for the `scores` field")
    if chosen is not None and _rationale(args):
        chosen = (*chosen, "rationale")
    return chosen


def _rationale(args: SearchContentArgs) -> bool:
    return args.rationale if args.rationale is not None else args.mode == "graph"


# Arguments that shape a page but not the ranking: a cursor stays valid when they change between pages.
_NOT_RANKING = frozenset({"cursor", "limit", "explain", "rationale", "response_mode", "fields"})


def _request(args: SearchContentArgs, chosen: tuple[str, ...] | None) -> pipeline.SearchRequest:
    return pipeline.SearchRequest(
        query=args.query, mode=args.mode, limit=args.limit, rationale=_rationale(args),
        explain=args.explain or (chosen is not None and "scores" in chosen), filters=args.filters())


class _Plan(SearchPlan):
    """search_content's plan: the core's, with the hit fields its response mode keeps (None: classic hits)."""

    __slots__ = ("chosen",)

    def __init__(self, services: Services, policy: TenantPolicy, args: SearchContentArgs) -> None:
        """Validates the arguments (InvalidArgument, before any database work) and plans the search."""
        self.chosen = chosen = _validate(services.settings, args)
        super().__init__(_request(args, chosen), settings=services.settings, embedder=services.embedder,
                         allowed_modes=policy.modes, whole_call=True)


def opening(services: Services, policy: TenantPolicy, args: SearchContentArgs) -> Opening:
    """The call's preflight (with the index state), sent with its BEGIN; bad arguments are refused first."""
    return _Plan(services, policy, args).opening


async def search_content(ctx: ToolContext, args: SearchContentArgs) -> tuple[dict[str, Any], AuditFacts]:
    opened = ctx.opened
    plan = opened.plan if isinstance(opened, Opening) else None
    if not isinstance(plan, _Plan):  # called without its opening: validated and planned here
        plan, opened = _Plan(ctx.services, ctx.policy, args), None
    chosen, request = plan.chosen, plan.request
    listing = paging.listing(ctx.principal, args.model_dump(mode="json", exclude=_NOT_RANKING))
    # The preflight, with the index state this result is cut from: the cache key's and the cursor's
    # (answered with BEGIN when the server sent the plan's opening, else one round trip here). The state
    # of what this result depends on: a lexical one ignores vectors, a vector one other sources.
    await plan.prepare(ctx.conn, opened)
    served, state = plan.mode, plan.state
    assert served is not None and state is not None
    if served not in ("lexical", "graph"):  # vectors of one model are another ranking than another model's
        assert ctx.services.embedder is not None
        served = f"{served}@{ctx.services.embedder.model_id}"
    offset = (paging.decode(ctx.services.cursors, args.cursor, ctx.principal, listing, state=state, mode=served)
              if args.cursor else 0)
    key = (ctx.principal.tenant_id, ctx.principal.subject, listing, tuple(sorted(ctx.policy.modes)), args.limit,
           request.explain, request.rationale, offset, served, state)
    results = ctx.services.search_cache
    result = results.get(key) if results is not None else None
    if result is None:
        result = await plan.run(ctx.conn, offset=offset, timings=ctx.meta.took_ms)
        if results is not None:
            results.put(key, result)
    else:
        ctx.meta.cache_hit = True
    hits = result.hits
    for hit in hits:
        hit["uri"] = file_uri(hit["source_id"], hit["key"])
        hit["url"] = ctx.download_url(hit["source_id"], hit["key"])
        if args.explain:
            hit["explain"] = hit.pop("explain", None)  # last, after the links, as the result always had it
        if request.rationale:
            hit["rationale"] = hit.pop("rationale", None)
    facts = AuditFacts(source_ids=[h["source_id"] for h in hits], keys=[h["key"] for h in hits],
                       row_count=len(hits), mode=result.mode)
    if chosen is not None:
        facts_by_hit = await hit_facts(ctx.conn, hits) if hit_fields.needs_facts(chosen) else {}
        hits = hit_fields.shape(hits, chosen, facts_by_hit, offset=offset)
    next_cursor = paging.encode(ctx.services.cursors, ctx.principal, listing, offset=offset + args.limit,
                                state=state, mode=served) if result.has_more else None
    # Built as plain JSON-ready dicts, not through SearchContentResult (its validation and dump cost
    # ~0.25 ms of the API's ~6 ms per search); the tests hold every result to the tool's outputSchema.
    return {"hits": hits, "mode": result.mode, "degraded": result.degraded,
            "degraded_reason": result.degraded_reason, "has_more": result.has_more, "next_cursor": next_cursor,
            "total_available": result.total_available, "total_available_is_exact": result.total_exact,
            "capped": result.capped}, facts
