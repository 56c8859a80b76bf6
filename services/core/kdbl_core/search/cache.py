"""A search result cache that is never stale: per principal and normalised arguments, keyed by the index
state the result was cut from, bounded in memory (LRU by estimated bytes, plus a TTL).

The index state is one number per result (migrations 0014, 0018): the largest generation over what that
kind of result depends on (INDEX_STATE below). Every change that can alter a result takes a fresh, larger
generation from one sequence, so a key built on the state a fresh query reads now can only find a result
cut from this same state: a cached answer is one a fresh query would give. The key also holds the
principal (tenant, subject, groups), the tenant policy's modes and the mode that served the search.

Finer than one number per source (issue 28): a lexical search depends on content (files, chunks,
postings and the BM25 statistics of every source the principal sees), not on vectors, so embedding a
source — hours of vector writes — no longer stales lexical results and cursors; a vector search depends
on the content and vectors of the sources it reads, not on what is written elsewhere; and no search
depends on a source its principal cannot see. What it still depends on: a file written to a visible
source moves every lexical state of that principal, even one filtered to another source, because BM25's
statistics (N, df, average length) are summed over every source it sees (kdbl_core.search.lexical).

The state is read by the search's preflight (kdbl_core.search.plan.SearchPlan.prepare, INDEX_STATE below:
one index range scan over the tenant's rows, up to 16 a source plus its own, in a statement the search
runs anyway); measured in docs/benchmarks.md ("Search cache and cursors"). The
cached value is the pipeline's result before links (download links are signed per call, they expire);
each hit is handed out as a fresh copy, since the tool adds fields to the hits it returns.

Bounded memory: entries are charged the characters of their hits' strings (+ 256 bytes a hit) and
the least recently used go first past KDBL_SEARCH_CACHE_BYTES; an entry older than
KDBL_SEARCH_CACHE_TTL_SECONDS is a miss (so memory held by a quiet key frees itself at the next put).
One cache per API process (no lock: the API's handlers run on one event loop thread).
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

# The index state, as a scalar subquery the search pipeline's preflight carries (no round trip of its own):
# four numbers from one index range scan over the tenant's rows (migrations 0014, 0018), each the largest
# generation over what one kind of result depends on (state_for picks by the mode that serves the search):
#   [0] lexical: the tenant's own row and the content of every source the principal sees (whole or through
#       a file grant) and of every source whose permissions come from the share (migration 0023: whether
#       the principal reads any of its files now or not, so a revoked permission moves its state): BM25's
#       statistics span all of them, so a file written to a visible source the query filters out still
#       moves the scores; a source it cannot see moves nothing;
#   [1] semantic: the tenant's own row, content and vectors of the sources the query reads (source_id,
#       source_ids, else every source it sees): a cosine does not depend on any other chunk;
#   [2] the vectors of those sources alone; hybrid is max([0], [2]);
#   [3] the entity mentions of those sources (migration 0026); graph (keywords and entities) is max([0], [3]).
# A vector written moves [1] and [2], never [0]: lexical results and cursors survive embedding; entities read
# move [3] alone.
INDEX_STATE = """(WITH per AS MATERIALIZED (  -- one row a scope: the shards folded first
           SELECT g.scope, max(g.generation) AS content, max(g.vector_generation) AS vectors,
                  max(g.entity_generation) AS entities
             FROM index_generations g WHERE g.tenant_id = kdbl_tenant() GROUP BY g.scope
       ), marked AS MATERIALIZED (
           SELECT per.content, per.vectors, per.entities, per.scope = kdbl_tenant() AS own,
                  (per.scope IN (SELECT ws.id FROM kdbl_whole_sources() AS ws(id))
                   OR per.scope IN (SELECT gr.source_id FROM grants gr
                                     WHERE gr.tenant_id = kdbl_tenant() AND gr.file_key IS NOT NULL
                                       AND gr.subject = ANY (kdbl_subjects()))
                   OR per.scope IN (SELECT sh.id FROM kdbl_share_sources() AS sh(id))) AS seen,
                  ((CAST(%(sid)s AS uuid) IS NULL AND cardinality(CAST(%(sids)s AS uuid[])) = 0)
                   OR per.scope = CAST(%(sid)s AS uuid) OR per.scope = ANY (CAST(%(sids)s AS uuid[]))) AS read
             FROM per)
       SELECT ARRAY[coalesce(max(content) FILTER (WHERE own OR seen), 0),
                    coalesce(max(greatest(content, vectors)) FILTER (WHERE own OR (seen AND read)), 0),
                    coalesce(max(vectors) FILTER (WHERE seen AND read), 0),
                    coalesce(max(entities) FILTER (WHERE seen AND read), 0)]
         FROM marked)"""


def state_for(states: tuple[int, ...], mode: str) -> int:
    """The index state a result served in `mode` depends on, from INDEX_STATE's four numbers."""
    if mode == "lexical":
        return states[0]
    if mode == "semantic":
        return states[1]
    if mode == "graph":
        return max(states[0], states[3])
    return max(states[0], states[2])


_HIT_OVERHEAD = 256  # dict, keys and numbers of one hit, roughly


def _size(value: Any) -> int:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values()) + _HIT_OVERHEAD
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


class ResultCache:
    """LRU of search results by estimated bytes, with a TTL. `max_bytes` 0 disables it."""

    def __init__(self, max_bytes: int, ttl_seconds: float, *, clock: Any = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.ttl = ttl_seconds
        self._clock = clock
        self._entries: OrderedDict[Hashable, tuple[float, int, Any]] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        """The cached result (a copy whose hits may be changed freely), or None."""
        entry = self._entries.get(key)
        if entry is None or self._clock() - entry[0] > self.ttl:
            if entry is not None:
                self._drop(key)
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return _copy(entry[2])

    def put(self, key: Hashable, result: Any) -> None:
        if self.max_bytes <= 0:
            return
        size = _size(getattr(result, "hits", ())) + _HIT_OVERHEAD
        if size > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self._clock(), size, _copy(result))
        self.bytes += size
        while self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: Hashable) -> None:
        _, size, _ = self._entries.pop(key)
        self.bytes -= size


def _copy(result: Any) -> Any:
    """The result with its own hit dicts (one level deep: the tool adds and removes hit keys)."""
    hits = [{k: dict(v) if isinstance(v, dict) else v for k, v in h.items()} for h in result.hits]
    return dataclasses.replace(result, hits=hits)
