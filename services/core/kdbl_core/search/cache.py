"""A search result cache that is never stale: per principal and normalised arguments, keyed by the index
state the result was cut from, bounded in memory (LRU by estimated bytes, plus a TTL).

The index state is one number (migration 0014): the largest generation over the tenant's own row
(grants, sources, the tenant's policy) and the rows of the sources a query reads (its source_id filter,
or all the tenant's sources). Every change that can alter a result takes a fresh, larger generation,
so a key built on the state a fresh query reads now can only find a result cut from this same state:
a cached answer is one a fresh query would give. The key also holds the principal (tenant, subject,
groups) and the tenant policy's modes, the two things besides the index that decide a result.

The state is read by the search's preflight (kdbl_core.search.pipeline.prepare, INDEX_STATE below: an
index range scan of up to 16 rows per source plus the tenant's own, in a statement the search runs
anyway); measured in docs/benchmarks.md ("Search cache and cursors"). The
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
# the largest generation over the tenant's own row and its sources' rows, or only the filtered sources'
# (source_id, source_ids: their union, a superset of what the filters read). One index range scan.
INDEX_STATE = """(SELECT coalesce(max(g.generation), 0) FROM index_generations g
         WHERE g.tenant_id = kdbl_tenant()
           AND (g.scope = kdbl_tenant()
                OR (CAST(%(sid)s AS uuid) IS NULL AND cardinality(CAST(%(sids)s AS uuid[])) = 0)
                OR g.scope = CAST(%(sid)s AS uuid) OR g.scope = ANY (CAST(%(sids)s AS uuid[]))))"""

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
