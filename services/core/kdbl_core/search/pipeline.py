"""The search pipeline: both arms, fusion, identifier pinning, rerank, diversification, hit windows and
snippets — everything between a validated request served in a chosen mode and the ranked hits. Its one
entry point is kdbl_core.search.plan.SearchPlan (issue 33): a plan reads the preflight, chooses the mode
and calls execute() here. The MCP tool (kdbl_api.tools.search) validates arguments, makes the plan and
adds links and URIs; `kdbl-control eval` and `bench` run the same plan, so what they measure is what
agents get.

Modes: lexical is the BM25 keyword arm; semantic the pgvector arm alone (hits that share no word with
the query); hybrid both arms, fused. hybrid and semantic need an embedder in this process, vectors allowed
by the tenant's policy (mcp.modes: "hybrid" allows both) and hybrid enabled for the tenant and (with a
source_id filter) for that source; otherwise the request is served lexically and says why
(`degraded_reason`; the plan decides, from its preflight).

Round trips (one search, counted on the wire in docs/architecture.md): one preflight statement (the
plan's opening) answers at once whether the filtered source is visible, the tenant's and source's hybrid
toggles and the query's lexemes, and sets the HNSW scan settings for the transaction (was four
statements: source check, toggles, query terms, settings); the rare-identifier pin is one statement (was
two). hybrid: 10 -> 7 statements, lexical: unchanged (2, or 3 with a source_id filter). Search mode
graph and `rationale` (issue 31, kdbl_core.search.entity_arm) look the query's candidate names up among
the caller's entities in the same preflight; graph runs the keyword and entity arms and fuses them (RRF),
and is served lexically, saying why, when the query names no entity the caller can read.

`timings` (optional, milliseconds by part) receives where the time went: embed, keyword (the BM25 arm
and the identifier pin), vector (the vector arm), rerank (fusion, rescoring, diversification), windows
(hit windows and snippets); the MCP tool passes its result's `meta.took_ms`. Five perf_counter reads.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from kdbl_core.db.async_pool import Connection
from kdbl_core.embedder import Embedder
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import bm25_topk, duplicates, entity_arm, hybrid, lexical, phrases, vector
from kdbl_core.search.lexical import ChunkHit, Filters
from kdbl_core.search.windows import Fetched, HitRef, expand_hits
from kdbl_core.settings import Settings

MODES = ("hybrid", "lexical", "semantic", "graph")


def _lap(timings: dict[str, float] | None, part: str, since: float) -> float:
    """Adds the milliseconds since `since` to timings[part] (when timings are asked for); returns now."""
    now = time.perf_counter()
    if timings is not None:
        timings[part] = timings.get(part, 0.0) + (now - since) * 1000
    return now


def check_query(query: str, settings: Settings) -> None:
    """The query rules every caller keeps (the MCP tool, eval): InvalidArgument when broken."""
    if len(query) > settings.max_query_chars:
        raise InvalidArgument("query", f"longer than {settings.max_query_chars} characters")
    if not query.strip():
        raise InvalidArgument("query", "must contain at least one non-blank character")


@dataclass(frozen=True, slots=True)
class SearchRequest:
    """A validated search: the query, the asked-for mode, how many hits, the filters."""

    query: str
    mode: str = "hybrid"
    limit: int = 20
    filters: Filters = field(default_factory=Filters)
    explain: bool = False
    rationale: bool = False  # each hit says why it matched: the query's words and entities it holds, its arms' ranks


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Ranked hits (JSON-ready dicts: text window, snippet, locators, rank, `duplicates` where other chunks
    hold the same text, and `explain` when asked), the mode that served them, and why it is not the
    asked-for one or not all of it (None when it is: hybrid whose candidates are partly embedded says so)."""

    hits: list[dict[str, Any]]
    mode: str
    degraded_reason: str | None = None
    has_more: bool = False  # the ranking goes on past this page (within the candidate cap)
    total_available: int = 0  # hits reachable by paging: exact when `total_exact`, else a lower bound
    total_exact: bool = True
    capped: bool = False  # the ranking reached the candidate cap: deeper hits are not paged (narrow the query)

    @property
    def degraded(self) -> bool:
        return self.degraded_reason is not None


def _retrieve(future: asyncio.Future) -> None:
    """Mark a background embedding's failure as seen when nobody awaits it (the request was cancelled)."""
    if not future.cancelled():
        future.exception()


async def _with_vectors(conn: Connection, request: SearchRequest, mode: str, settings: Settings, embedder: Embedder,
                        terms: list[str], wanted: int, timings: dict[str, float] | None = None
                        ) -> tuple[list[hybrid.Fused], dict[int, duplicates.TextKey], str | None]:
    """hybrid: both arms fused (and rescored); semantic: the vector arm alone, in its own order. One hit per
    text (deeper arms when copies leave the page short); with the text keys, and for hybrid whose
    candidates are not all embedded, the degraded reason (hybrid.keep_keyword_slots)."""
    filters = request.filters
    depth = max(request.limit, settings.hybrid_depth)
    lap = time.perf_counter()
    # The query's embedding (CPU, in a thread) while the keyword arm runs in the database: two cores at
    # work instead of one after the other (hybrid p50 at 1M chunks: see docs/benchmarks.md).
    embedding = asyncio.get_running_loop().run_in_executor(None, embedder.embed_query, request.query)
    embedding.add_done_callback(_retrieve)

    async def keyword_arm() -> tuple[list[ChunkHit], set[int]]:
        found = await bm25_topk.search(conn, request.query, filters, limit=depth,
                                       ts_config=settings.text_search_config,
                                       exhaustive=settings.bm25_exhaustive, native=settings.bm25_native)
        return found, await lexical.chunks_with_rare_terms(conn, [h.chunk_id for h in found],
                                                           [t for t in terms if hybrid.is_identifier(t)])

    lex: list[ChunkHit] = []
    pinned: set[int] = set()
    try:
        if mode == "hybrid":
            lex, pinned = await keyword_arm()
            lap = _lap(timings, "keyword", lap)
    finally:
        query_vector = await embedding
    lap = _lap(timings, "embed", lap)
    tuned, unembedded = True, 0
    while True:
        keys: dict[int, duplicates.TextKey] = {}  # every candidate's raw text key, read by the statements below
        vec = await vector.search(conn, query_vector, embedder.model_id, filters, limit=depth, tuned=tuned, keys=keys)
        if quoted := phrases.parse(request.query):  # a phrase query's hits hold its phrases (search.phrases)
            held = await phrases.holding(conn, [h.chunk_id for h in vec], quoted, ts_config=settings.text_search_config)
            vec = [h for h in vec if h.chunk_id in held]
        lap = _lap(timings, "vector", lap)
        fused = hybrid.fuse(lex, vec, k=settings.hybrid_rrf_k, vector_weight=settings.hybrid_vector_weight,
                            pinned_chunks=pinned)
        bm25: dict[int, float] | None = None  # every candidate's BM25 score, when the rerank looked them all up
        if mode == "hybrid":
            ids = [f.hit.chunk_id for f in fused]
            lex_scores = {h.chunk_id: h.score for h in lex}
            vec_scores = {h.chunk_id: h.score for h in vec}
            rescored = settings.hybrid_rerank == "scores"
            if rescored:
                lex_scores.update(await lexical.scores_for(conn, request.query,
                                                           [i for i in ids if i not in lex_scores],
                                                           ts_config=settings.text_search_config))
            # the keyword arm's candidates the vector arm did not return: their cosine (the rerank's), whether
            # they have a vector at all (one without keeps its keyword rank) and their text keys
            vec_scores.update(await vector.similarities(conn, query_vector, embedder.model_id,
                                                        [i for i in ids if i not in vec_scores], keys=keys))
            if rescored:
                fused = hybrid.rescore(fused, lex_scores, vec_scores,
                                       lexical_weight=settings.hybrid_rerank_lexical_weight)
            unembedded = len(ids) - len(vec_scores)
            if unembedded:
                fused = hybrid.keep_keyword_slots(fused, lex_scores, vec_scores.keys())
            bm25 = lex_scores if rescored else None
        # one hit per text: the raw keys, and where every candidate has its BM25 score, the normalised keys
        # of the chosen hits' ties
        groups, folded = await duplicates.collapse_ranked(
            conn, fused, keys, bm25, chunk=lambda f: f.hit, limit=wanted,
            admit=lambda: hybrid.diverse(settings.hybrid_max_per_file))
        again = duplicates.deeper(depth, max(len(lex), len(vec)), wanted, len(groups), folded)
        if again is None:
            break
        depth, tuned = again, False
        if mode == "hybrid":
            lex, pinned = await keyword_arm()
    for group in groups:
        group.item.copies = group.copies
    reason = None
    if unembedded:
        embedded, total = await vector.embedded_share(conn, embedder.model_id, filters)
        share = f"; {embedded:,} of {total:,} chunks searched have vectors ({embedded / total:.0%})" if total else ""
        reason = (f"partly embedded: {unembedded} of {len(fused)} candidates have no vector yet and keep their "
                  f"keyword rank{share}")
    _lap(timings, "rerank", lap)
    return [group.item for group in groups], keys, reason


async def _with_entities(conn: Connection, request: SearchRequest, settings: Settings,
                         entities: tuple[entity_arm.QueryEntity, ...], wanted: int,
                         timings: dict[str, float] | None = None
                         ) -> tuple[list[hybrid.Fused], dict[int, duplicates.TextKey]]:
    """graph: the keyword arm and the entity arm (the chunks naming the query's entities), fused by RRF, one hit
    per text, diversified like hybrid; with the text keys."""
    depth = max(request.limit, settings.hybrid_depth)
    while True:
        lap = time.perf_counter()
        lex = await bm25_topk.search(conn, request.query, request.filters, limit=depth,
                                     ts_config=settings.text_search_config,
                                     exhaustive=settings.bm25_exhaustive, native=settings.bm25_native)
        lap = _lap(timings, "keyword", lap)
        named = await entity_arm.search(conn, entities, request.filters, limit=depth)
        lap = _lap(timings, "graph", lap)
        fused = hybrid.fuse(lex, [], k=settings.hybrid_rrf_k, graph=named)
        # one hit per text as lexical finds them: copies share their BM25 score, so only the chosen hits' ties
        # are hashed (the entity arm's own candidates, scored 0 here, are ties of each other)
        keys = {}
        groups, folded = await duplicates.collapse_ranked(
            conn, fused, keys, {h.chunk_id: h.score for h in lex}, chunk=lambda f: f.hit, limit=wanted,
            admit=lambda: hybrid.diverse(settings.hybrid_max_per_file))
        _lap(timings, "rerank", lap)
        again = duplicates.deeper(depth, max(len(lex), len(named)), wanted, len(groups), folded)
        if again is None:
            break
        depth = again
    for group in groups:
        group.item.copies = group.copies
    return [group.item for group in groups], keys


def _why(explanation: dict | None, found: tuple[list[str], list[entity_arm.QueryEntity]] | None) -> dict[str, Any]:
    """A hit's rationale: the query's words and entities it holds, and its rank in each arm (None: not there)."""
    e = explanation or {}
    words, entities = found or ([], [])
    return {"terms": words, "entities": [{"name": x.name, "type": x.type} for x in entities],
            "ranks": {"keyword": e.get("lexical_rank"), "vector": e.get("vector_rank"), "graph": e.get("graph_rank")},
            "pinned_identifier": bool(e.get("pinned_identifier"))}


def _ranking_length(request: SearchRequest, settings: Settings, offset: int) -> int:
    """Ranked hits a page needs: through its end plus one (has_more), within the candidate cap
    max(limit, hybrid_depth), the depth every arm runs at whatever the page (kdbl_core.search.paging)."""
    return min(offset + request.limit + 1, max(request.limit, settings.hybrid_depth))


async def execute(conn: Connection, request: SearchRequest, *, mode: str, degraded_reason: str | None,
                  terms: list[str], entities: tuple[entity_arm.QueryEntity, ...], settings: Settings,
                  embedder: Embedder | None, offset: int = 0, timings: dict[str, float] | None = None) -> SearchResult:
    """The pipeline for the page [offset, offset + limit), in the caller's RLS transaction `conn` (only what
    the principal sees counts), served in `mode` (kdbl_core.search.plan chose it, from its preflight: the
    query's lexemes `terms` and `entities` come from there too)."""
    wanted = _ranking_length(request, settings, offset)
    explanations: list[dict | None]
    if mode == "lexical":
        lap = time.perf_counter()
        fetch = wanted
        fetched = Fetched()  # the hits' windows, read with the keyword statement (bm25_native), else below
        while True:  # one hit per text: deeper while copies leave the page short (exact: the best distinct texts)
            ranked = await bm25_topk.search(conn, request.query, request.filters, limit=fetch,
                                            ts_config=settings.text_search_config,
                                            exhaustive=settings.bm25_exhaustive, native=settings.bm25_native,
                                            fetched=fetched)
            keys = {}
            groups, folded = await duplicates.collapse_ranked(conn, ranked, keys, {h.chunk_id: h.score for h in ranked},
                                                              chunk=lambda h: h, limit=wanted)
            again = duplicates.deeper(fetch, len(ranked), wanted, len(groups), folded)
            if again is None:
                break
            fetch = again
        _lap(timings, "keyword", lap)
        refs = [HitRef(g.item.file_id, g.item.source_id, g.item.key, g.item.seq, g.item.score) for g in groups]
        copies = [g.copies for g in groups]
        explanations = [{"lexical_rank": i, "lexical_score": round(g.item.score, 6), "vector_rank": None,
                         "vector_score": None, "graph_rank": None, "graph_score": None,
                         "fused": round(g.item.score, 6), "pinned_identifier": False}
                        for i, g in enumerate(groups, 1)]
    elif mode == "graph":
        fetched = None
        chosen, keys = await _with_entities(conn, request, settings, entities, wanted, timings)
        refs = [HitRef(f.hit.file_id, f.hit.source_id, f.hit.key, f.hit.seq, f.score) for f in chosen]
        copies = [f.copies for f in chosen]
        explanations = [f.explanation() for f in chosen]
    else:
        assert embedder is not None
        fetched = None
        chosen, keys, partial = await _with_vectors(conn, request, mode, settings, embedder, terms, wanted, timings)
        degraded_reason = degraded_reason or partial
        refs = [HitRef(f.hit.file_id, f.hit.source_id, f.hit.key, f.hit.seq, f.score) for f in chosen]
        copies = [f.copies for f in chosen]
        explanations = [f.explanation() for f in chosen]
    end = offset + request.limit
    page = slice(offset, end)
    paging = {"has_more": len(refs) > end, "total_available": len(refs), "total_exact": len(refs) < wanted,
              "capped": len(refs) == wanted <= end}
    refs, explanations, copies = refs[page], explanations[page], copies[page]
    lap = time.perf_counter()
    hits = await expand_hits(conn, refs, query=request.query, ts_config=settings.text_search_config,
                             fetched=fetched)
    _lap(timings, "windows", lap)
    copies_by_pos = {(str(r.source_id), r.key, r.seq): c for r, c in zip(refs, copies) if c}
    for hit in hits:
        if found := copies_by_pos.get((hit["source_id"], hit["key"], hit["seq"])):
            hit["duplicates"] = duplicates.described(found, keys)
    if request.explain:
        explain_by_pos = {(str(r.source_id), r.key, r.seq): e for r, e in zip(refs, explanations)}
        for hit in hits:
            hit["explain"] = explain_by_pos.get((hit["source_id"], hit["key"], hit["seq"]))
    if request.rationale:
        found = await entity_arm.rationale(conn, request.query, entities, [(r.file_id, r.seq) for r in refs],
                                           ts_config=settings.text_search_config)
        why_by_pos = {(str(r.source_id), r.key, r.seq): _why(e, found.get((r.file_id, r.seq)))
                      for r, e in zip(refs, explanations)}
        for hit in hits:
            hit["rationale"] = why_by_pos.get((hit["source_id"], hit["key"], hit["seq"]))
    return SearchResult(hits=hits, mode=mode, degraded_reason=degraded_reason, **paging)

