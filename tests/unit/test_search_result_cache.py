"""kdbl_core.search.cache.ResultCache: LRU by estimated bytes, a TTL, copies handed out; the index state a
result of each mode depends on; and kdbl_core.search.paging: a cursor is bound to its listing, index state
and serving mode."""

from __future__ import annotations

import uuid

import pytest

from kdbl_core.access.principal import Principal
from kdbl_core.access.signing import CursorCodec
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import paging
from kdbl_core.search.cache import ResultCache, state_for
from kdbl_core.search.pipeline import SearchResult


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def result(text: str = "x" * 100) -> SearchResult:
    return SearchResult(hits=[{"key": "a.md", "text": text, "explain": {"fused": 1.0}}], mode="lexical")


def test_a_cached_result_comes_back_as_a_copy_the_caller_may_change():
    cache = ResultCache(10_000, 60)
    cache.put("k", result())
    got = cache.get("k")
    got.hits[0]["uri"] = "changed"
    got.hits[0]["explain"]["fused"] = 2.0
    again = cache.get("k")
    assert "uri" not in again.hits[0] and again.hits[0]["explain"] == {"fused": 1.0}
    assert (cache.hits, cache.misses) == (2, 0)


def test_the_least_recently_used_entry_goes_first_when_the_bytes_run_out():
    probe = ResultCache(10_000, 60)
    probe.put("k", result())
    cache = ResultCache(3 * probe.bytes, 60)  # room for three entries
    for key in "abc":
        cache.put(key, result())
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put("d", result())
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("d") is not None
    assert cache.bytes <= cache.max_bytes and len(cache) == 3


def test_an_entry_older_than_the_ttl_is_a_miss_and_is_dropped():
    clock = Clock()
    cache = ResultCache(10_000, 60, clock=clock)
    cache.put("k", result())
    clock.now = 60.5
    assert cache.get("k") is None and len(cache) == 0 and cache.bytes == 0


def test_a_cache_of_zero_bytes_keeps_nothing_and_a_result_larger_than_the_cache_is_not_kept():
    off = ResultCache(0, 60)
    off.put("k", result())
    small = ResultCache(500, 60)
    small.put("k", result("y" * 1000))
    assert off.get("k") is None and small.get("k") is None and small.bytes == 0


PRINCIPAL = Principal(tenant_id=uuid.uuid4(), tenant_name="t", subject="user:a", groups=("finance",))
CODEC = CursorCodec(b"k" * 32)


def test_a_cursor_gives_back_its_offset_for_the_same_listing_and_state():
    listing = paging.listing(PRINCIPAL, {"query": "q", "mode": "lexical"})
    cursor = paging.encode(CODEC, PRINCIPAL, listing, offset=20, state=7, mode="lexical")
    assert paging.decode(CODEC, cursor, PRINCIPAL, listing, state=7, mode="lexical") == 20


def test_a_cursor_cut_from_another_index_state_is_stale_on_cursor():
    listing = paging.listing(PRINCIPAL, {"query": "q"})
    cursor = paging.encode(CODEC, PRINCIPAL, listing, offset=20, state=7, mode="lexical")
    with pytest.raises(InvalidArgument) as err:
        paging.decode(CODEC, cursor, PRINCIPAL, listing, state=8, mode="lexical")
    assert err.value.field == "cursor" and "stale:" in str(err.value)


def test_a_cursor_cut_by_another_serving_mode_or_embedding_model_is_stale_on_cursor():
    """A hybrid search served lexically on one replica (no embedder) and with vectors on another, or by
    two embedding models during a rollout, is two rankings even at one index state."""
    listing = paging.listing(PRINCIPAL, {"query": "q", "mode": "hybrid"})
    cursor = paging.encode(CODEC, PRINCIPAL, listing, offset=20, state=7, mode="hybrid@model-a")
    for mode in ("lexical", "hybrid@model-b"):
        with pytest.raises(InvalidArgument) as err:
            paging.decode(CODEC, cursor, PRINCIPAL, listing, state=7, mode=mode)
        assert "stale:" in str(err.value)
    assert paging.decode(CODEC, cursor, PRINCIPAL, listing, state=7, mode="hybrid@model-a") == 20


def test_each_mode_takes_the_state_of_what_its_results_depend_on():
    """[lexical: content of what the caller sees, semantic: content and vectors of what it reads, vectors of
    what it reads]: hybrid depends on both lexical's and the vectors'."""
    states = (10, 7, 12)
    assert state_for(states, "lexical") == 10 and state_for(states, "semantic") == 7
    assert state_for(states, "hybrid") == 12 and state_for((10, 7, 3), "hybrid") == 10


def test_the_listing_differs_by_groups_and_by_ranking_arguments():
    other_groups = Principal(tenant_id=PRINCIPAL.tenant_id, tenant_name="t", subject="user:a", groups=())
    base = paging.listing(PRINCIPAL, {"query": "q", "mode": "lexical"})
    assert base != paging.listing(other_groups, {"query": "q", "mode": "lexical"})
    assert base != paging.listing(PRINCIPAL, {"query": "q", "mode": "hybrid"})
    assert base == paging.listing(PRINCIPAL, {"mode": "lexical", "query": "q"})
    cursor = paging.encode(CODEC, PRINCIPAL, base, offset=5, state=1, mode="lexical")
    with pytest.raises(InvalidArgument) as err:
        paging.decode(CODEC, cursor, other_groups, base.replace("a", "b"), state=1, mode="lexical")
    assert err.value.field == "cursor"
