"""One search call as one plan (issue 33): the single entry point of search. Made once per call from a
validated SearchRequest, the settings, the embedder and the tenant policy's modes, a SearchPlan owns

- `opening`: its preflight, a Statement to send with the transaction's BEGIN (one round trip fewer:
  kdbl_core.db.async_pool.AsyncPool.transaction `also`; the MCP tool's registry hook returns it);
- `prepare(conn, opened)`: reads that statement's answer (or runs it) and decides the serving mode, its
  degraded reason and the index state the result depends on (`mode`, `degraded_reason`, `state`: the
  result cache's key and the cursor's binding);
- `run(conn, offset=, timings=)`: the pipeline (kdbl_core.search.pipeline.execute) for the page at `offset`.

Was three calls into the pipeline (preflight_statement, prepare + index_state, search) that each re-derived
what the request needs — whether vectors may serve it, the query's candidate entity names — and a tool that
carried the validated request beside the statement. A plan derives them once, and nothing here validates:
the caller has (the MCP tool once per call, in its opening hook).

The preflight answers in one round trip whether the filtered source(s) are visible, the tenant's and
source's hybrid toggles, the query's lexemes (hybrid's identifier pinning), the index state, and for graph
and `rationale` the query's candidate names among the caller's entities; it sets the HNSW scan settings
for the transaction (was four statements). run() without prepare() skips it where the request needs none
(lexical, no source filter, no entities: `bench search`'s floor), as the pipeline always did. One plan
serves one transaction at a time: prepare() again in a retry's transaction (its copy of the opening).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kdbl_core.db.async_pool import Connection, Statement
from kdbl_core.embedder import Embedder
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import entity_arm, lexical, pipeline
from kdbl_core.search.cache import INDEX_STATE, state_for
from kdbl_core.search.pipeline import MODES, SearchRequest, SearchResult
from kdbl_core.settings import Settings

# Source visibility (a source_id filter the caller cannot see is an error), the hybrid toggles, the
# query's lexemes (hybrid's identifier pinning) and the vector arm's HNSW settings, in one round trip.
# `source_on` is NULL exactly when the source is not visible (sources.hybrid_enabled is NOT NULL).
_PREFLIGHT = f"""
SELECT (SELECT t.hybrid_enabled FROM tenants t WHERE t.id = kdbl_tenant()) AS tenant_on,
       (SELECT s.hybrid_enabled FROM sources s
         WHERE s.tenant_id = kdbl_tenant() AND s.id = CAST(%(sid)s AS uuid)) AS source_on,
       (SELECT CASE WHEN count(*) = cardinality(CAST(%(sids)s AS uuid[])) THEN coalesce(bool_or(s.hybrid_enabled), false) END
          FROM sources s WHERE s.tenant_id = kdbl_tenant() AND s.id = ANY (CAST(%(sids)s AS uuid[]))) AS sources_on,
       ARRAY(SELECT DISTINCT t.term FROM kdbl_terms(CAST(%(cfg)s AS regconfig), CAST(%(query)s AS text)) AS t)
           AS terms,
       CASE WHEN %(tune)s THEN set_config('hnsw.ef_search', %(ef)s, true) END AS ef_search,
       CASE WHEN %(tune)s THEN set_config('hnsw.iterative_scan', 'relaxed_order', true) END AS iterative_scan,
       CASE WHEN %(generic)s THEN set_config('plan_cache_mode', 'force_generic_plan', true) END AS generic_plans,
       {INDEX_STATE} AS state,
       (SELECT jsonb_agg(jsonb_build_array(e.id, e.type, e.key, e.name) ORDER BY e.id) FROM entities e
         WHERE e.tenant_id = kdbl_tenant() AND e.key = ANY (CAST(%(ekeys)s AS text[]))) AS entities
"""

_NO_ENTITY = ("graph: the query names no person, organisation, place, product or event found in what you can "
              "read (or its sources have entities off); served by keywords")


@dataclass(slots=True)
class Opening(Statement):
    """A plan's preflight, sent with the call's BEGIN. It leads back to its plan, and so does the copy a
    retry sends (kdbl_api.read_route: dataclasses.replace with rows=None)."""

    plan: SearchPlan = field(kw_only=True, repr=False)


class SearchPlan:
    """One search: its opening statement, then prepare() in the call's transaction, then run()."""

    __slots__ = ("request", "settings", "embedder", "allowed_modes", "opening", "_vectors", "_windows",
                 "_generic", "_prepared", "terms", "states", "entities", "mode", "degraded_reason", "state")

    def __init__(self, request: SearchRequest, *, settings: Settings, embedder: Embedder | None = None,
                 allowed_modes: tuple[str, ...] | frozenset[str] = MODES, whole_call: bool = False) -> None:
        """`whole_call`: the plan's transaction is the search and its audit row only (search_content): a
        lexical one's preflight then sets generic plans for the transaction (kdbl_core.search.lexical) and the
        keyword statements go without the setting around them."""
        self.request, self.settings, self.embedder = request, settings, embedder
        self.allowed_modes = allowed_modes
        mode, filters = request.mode, request.filters
        # vectors may serve it (then the preflight tunes HNSW and reads hybrid's lexemes)
        self._vectors = vectors = (mode in ("hybrid", "semantic") and "hybrid" in allowed_modes
                                   and embedder is not None)
        # the query's candidate entity names, when the request needs its entities (graph, rationale)
        self._windows = entity_arm.windows(request.query) if mode == "graph" or request.rationale else ()
        # generic plans for the whole transaction: a lexical search whose statements after the keyword arm
        # are primary-key probes (the rationale's entity lookups keep custom plans)
        self._generic = whole_call and mode == "lexical" and not request.rationale
        sid = filters.source_id
        depth = max(request.limit, settings.hybrid_depth)
        self.opening = Opening(_PREFLIGHT, {
            "sid": str(sid) if sid else None, "sids": [str(s) for s in dict.fromkeys(filters.source_ids)],
            "cfg": settings.text_search_config, "query": request.query if vectors and mode == "hybrid" else None,
            "tune": vectors, "ef": str(min(1000, max(64, 2 * depth))), "ekeys": entity_arm.keys(self._windows),
            "generic": self._generic,
        }, plan=self)
        self._prepared = False  # the preflight was read in this transaction (and set generic plans, if _generic)
        # from the preflight: hybrid's lexemes, the four index states (kdbl_core.search.cache), the query's
        # entities
        self.terms: list[str] = []
        self.states: tuple[int, ...] = (0, 0, 0, 0)
        self.entities: tuple[entity_arm.QueryEntity, ...] = ()
        # the serving mode, why it is not the asked-for one (None: it is) and the index state its result
        # depends on: None until prepare() (or run()) has read them
        self.mode: str | None = None
        self.degraded_reason: str | None = None
        self.state: int | None = None

    async def prepare(self, conn: Connection, opened: Statement | None = None) -> None:
        """Reads the preflight in the call's transaction `conn` — from `opened` (this plan's opening, or a
        retry's copy of it) when its rows came with BEGIN, else in a round trip of its own — and sets `mode`,
        `degraded_reason` and `state`. InvalidArgument for a source filter naming a source the caller
        cannot see. Folding the state into the preflight costs hybrid and semantic no round trip; sent with
        BEGIN, lexical's costs none either (docs/benchmarks.md)."""
        if opened is not None and opened.rows is not None:
            assert getattr(opened, "plan", None) is self, "another plan's opening"
            row = opened.rows[0]
        else:
            cur = await conn.execute(self.opening.sql, self.opening.params)
            row = await cur.fetchone()
        self._read(row)
        self._prepared = True

    async def run(self, conn: Connection, *, offset: int = 0,
                  timings: dict[str, float] | None = None) -> SearchResult:
        """The ranked hits [offset, offset + limit) in `conn` (the transaction prepare() read the preflight
        in; without prepare(), the preflight runs here where the request needs one). `timings` receives
        where the time went (kdbl_core.search.pipeline)."""
        if not self._prepared:
            filters = self.request.filters
            if self._vectors or filters.source_id is not None or filters.source_ids or self._windows:
                await self.prepare(conn)
            else:  # lexical, unfiltered by source, no entities: nothing the preflight would tell
                self.mode, self.degraded_reason = self._choose(None)
                self.state = None  # not read
        # the next run, in another transaction, reads its own preflight
        generic, self._prepared = self._generic and self._prepared, False
        if generic:  # the preflight set generic plans for this transaction: the keyword arm sends no setting
            with lexical.generic_plans_set():
                return await self._execute(conn, offset, timings)
        return await self._execute(conn, offset, timings)

    async def _execute(self, conn: Connection, offset: int, timings: dict[str, float] | None) -> SearchResult:
        assert self.mode is not None
        return await pipeline.execute(conn, self.request, mode=self.mode, degraded_reason=self.degraded_reason,
                                      terms=self.terms, entities=self.entities, settings=self.settings,
                                      embedder=self.embedder, offset=offset, timings=timings)

    def _read(self, row: Any) -> None:
        assert row is not None  # one row, always
        filters = self.request.filters
        if filters.source_id is not None and row.source_on is None:
            raise InvalidArgument("source_id", f"unknown source {filters.source_id} (or not visible to you)")
        if filters.source_ids and row.sources_on is None:  # one message whether missing or hidden: no oracle
            raise InvalidArgument("source_ids", "an unknown source (or one not visible to you)")
        self.terms = list(row.terms or ())
        self.states = tuple(int(s) for s in row.state)
        self.entities = tuple(entity_arm.chosen(self._windows, row.entities)) if row.entities else ()
        self.mode, self.degraded_reason = self._choose(row)
        self.state = state_for(self.states, self.mode)

    def _choose(self, row: Any) -> tuple[str, str | None]:
        """(mode to run, reason it was degraded or None), from the preflight's row (None: not read)."""
        request = self.request
        if request.mode == "lexical":
            return "lexical", None
        if request.mode == "graph":
            return ("graph", None) if entity_arm.seeds(self.entities) else ("lexical", _NO_ENTITY)
        if "hybrid" not in self.allowed_modes:  # the tenant's policy allows lexical search only
            return "lexical", "semantic search is not allowed for this tenant (policy: lexical only)"
        if self.embedder is None:
            return "lexical", "no embedder deployed"
        assert row is not None
        if not row.tenant_on:
            return "lexical", "hybrid is disabled for this tenant"
        if request.filters.source_id is not None and row.source_on is False:
            return "lexical", "hybrid is disabled for this source"
        if request.filters.source_ids and row.sources_on is False:
            return "lexical", "hybrid is disabled for these sources"
        return request.mode, None
