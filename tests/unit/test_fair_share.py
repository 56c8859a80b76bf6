"""kdbl_api.fair_share in process: each tenant's cost units in flight, first come first served, bounded waits,
and what each call costs. The HTTP behaviour (429 + Retry-After, audit, another tenant served meanwhile)
is in tests/integration/test_tenant_fair_share.py."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from kdbl_api.fair_share import FairShare, cost
from kdbl_api.observability import Observability
from kdbl_core.access.policy import Limits
from kdbl_core.errors import RateLimited

A, B = uuid.uuid4(), uuid.uuid4()


def _share(pool_size: int = 10) -> tuple[FairShare, Observability]:
    obs = Observability()
    return FairShare(obs, pool_size=pool_size), obs


def _metric(obs: Observability, name: str, labels: dict[str, str] | None = None) -> float:
    return obs.registry.get_sample_value(name, labels or {})


async def _until(check, what: str) -> None:
    """Let the event loop run until `check()` holds (bounded in loop turns, not time)."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def test_a_call_costs_more_the_more_it_asks_for():
    assert cost("tools/list", "tools/list", {}) == cost("initialize", "initialize", {}) == 0
    assert cost("resources/read", "resources/read", {"uri": "kdbl://file/x/y"}) == 1
    assert cost("tools/call", "search_content", {"query": "okapi"}) == 1
    assert cost("tools/call", "search_content", {"query": "okapi", "limit": 100}) == 2
    assert cost("tools/call", "search_content", {"query": "okapi " * 100, "limit": 100}) == 3
    assert cost("tools/call", "answer", {"question": "why"}) == 2
    assert cost("tools/call", "answer", {"question": "why", "answer_type": "abstractive"}) == 4
    assert cost("tools/call", "find_similar", {"subject": {"kind": "file", "id": "kdbl://file/a/b"}}) == 1
    assert cost("tools/call", "find_similar", {"subject": {"kind": "text", "text": "x" * 20_000}, "limit": 100}) == 4
    assert cost("tools/call", "get_contents", {"ids": ["a"] * 100}) == 2
    assert cost("tools/call", "search_content", {"query": 5, "limit": "many"}) == 1  # bad input: the SDK refuses it


async def test_a_tenant_at_its_limit_is_refused_while_another_tenant_still_gets_slots():
    share, obs = _share()
    limits = Limits(max_in_flight=2, queue_ms=0)
    first = await share.acquire(A, "a", 2, limits)
    with pytest.raises(RateLimited) as refused:
        await share.acquire(A, "a", 1, limits)
    assert refused.value.retry_after_sec == 1 and refused.value.http_status == 429
    assert refused.value.data == {"retry_after_sec": 1, "in_flight": 2, "max_in_flight": 2, "cost": 1}
    assert "--max-in-flight" in refused.value.message and "tenant 'a'" in refused.value.message
    other = await share.acquire(B, "b", 2, limits)
    assert (share.in_flight(A), share.in_flight(B)) == (2, 2)
    assert _metric(obs, "kdbl_call_slots_in_use") == 4 and _metric(obs, "kdbl_call_slots_full") == 2
    assert _metric(obs, "kdbl_call_slots_refused_total", {"reason": "full"}) == 1
    first.release()
    first.release()  # once only
    other.release()
    assert share.in_flight(A) == share.in_flight(B) == 0
    assert _metric(obs, "kdbl_call_slots_in_use") == 0 and _metric(obs, "kdbl_call_slots_full") == 0


async def test_waiting_calls_get_their_slots_first_come_first_served():
    share, obs = _share()
    limits = Limits(max_in_flight=3, queue_ms=60_000)
    held = await share.acquire(A, "a", 3, limits)
    order: list[str] = []

    async def call(name: str, units: int) -> None:
        slot = await share.acquire(A, "a", units, limits)
        order.append(name)
        await release.wait()
        slot.release()

    release = asyncio.Event()
    big = asyncio.create_task(call("big", 3))
    await _until(lambda: _metric(obs, "kdbl_call_slots_waiting") == 1, "the big call waits")
    small = asyncio.create_task(call("small", 1))
    await _until(lambda: _metric(obs, "kdbl_call_slots_waiting") == 2, "the small call waits behind it")
    held.release()
    await _until(lambda: order == ["big"], "the big call runs first")
    assert share.in_flight(A) == 3 and _metric(obs, "kdbl_call_slots_waiting") == 1  # small is not let past it
    release.set()
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and share.in_flight(A) == 0
    assert _metric(obs, "kdbl_call_slot_wait_seconds_count") == 2


async def test_a_call_that_waits_past_its_queue_time_is_refused_and_leaves_no_trace():
    share, obs = _share()
    limits = Limits(max_in_flight=1, queue_ms=1)
    held = await share.acquire(A, "a", 1, limits)
    with pytest.raises(RateLimited):
        await share.acquire(A, "a", 1, limits)
    assert _metric(obs, "kdbl_call_slots_waiting") == 0 and share.in_flight(A) == 1
    held.release()
    again = await share.acquire(A, "a", 1, limits)  # nothing left queued in its way
    again.release()


async def test_a_waiting_call_cancelled_by_its_client_gives_its_place_up():
    share, obs = _share()
    limits = Limits(max_in_flight=1, queue_ms=60_000)
    held = await share.acquire(A, "a", 1, limits)
    waiting = asyncio.create_task(share.acquire(A, "a", 1, limits))
    await _until(lambda: _metric(obs, "kdbl_call_slots_waiting") == 1, "the call waits")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert _metric(obs, "kdbl_call_slots_waiting") == 0
    held.release()
    assert share.in_flight(A) == 0


async def test_a_call_costing_more_than_the_limit_runs_alone_and_no_tenant_holds_the_whole_pool():
    share, _ = _share(pool_size=3)
    assert share.limit(Limits(max_in_flight=100)) == 2  # pool 3: one connection always left to others
    slot = await share.acquire(A, "a", 4, Limits(max_in_flight=2, queue_ms=0))
    assert slot.units == 2 and share.in_flight(A) == 2
    slot.release()
    assert _share(pool_size=1)[0].limit(Limits(max_in_flight=4)) == 1


def test_the_policys_built_in_limits_are_the_installations_defaults():
    from kdbl_core.settings import Settings

    assert Limits() == Limits.of(Settings())  # what a call without a policy in its scope gets


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_heavier_tenants_checkpoint_waits_while_a_lighter_tenants_call_runs_and_goes_on_when_it_ends():
    clock = _Clock()
    share = FairShare(Observability(), pool_size=10, defer_max_s=600, clock=clock)
    limits = Limits(max_in_flight=4, queue_ms=0)
    heavy = await share.acquire(A, "a", 4, limits)
    clock.now = 2.0  # A has kept 4 units busy for two seconds
    light = await share.acquire(B, "b", 1, limits)
    deferred = asyncio.ensure_future(share.defer(A))
    await share.defer(B)  # the lighter tenant never waits for the heavier one
    await _until(lambda: not deferred.done() and share._lighter_busy(A), "A deferring to B")
    light.release()
    await asyncio.wait_for(deferred, 60)  # B's call ended: A goes on
    heavy.release()


async def test_a_checkpoint_holds_a_heavier_call_back_only_for_its_bound():
    clock = _Clock()
    share = FairShare(Observability(), pool_size=10, defer_max_s=0.01, clock=clock)
    limits = Limits(max_in_flight=4, queue_ms=0)
    heavy = await share.acquire(A, "a", 4, limits)
    clock.now = 2.0
    light = await share.acquire(B, "b", 1, limits)
    await asyncio.wait_for(share.defer(A), 60)  # B still runs: A goes on after the bound all the same
    light.release()
    heavy.release()
    assert share.in_flight(A) == share.in_flight(B) == 0


async def test_tenants_of_similar_use_do_not_defer_to_each_other_and_idle_records_are_forgotten():
    clock = _Clock()
    share = FairShare(Observability(), pool_size=10, defer_max_s=600, clock=clock)
    limits = Limits(max_in_flight=4, queue_ms=0)
    a, b = await share.acquire(A, "a", 2, limits), await share.acquire(B, "b", 2, limits)
    clock.now = 2.0
    await asyncio.wait_for(asyncio.gather(share.defer(A), share.defer(B)), 60)
    a.release()
    b.release()
    clock.now = 60.0  # their use decays away: the next release drops both records
    (await share.acquire(A, "a", 1, limits)).release()
    assert share._tenants == {}


async def test_core_checkpoints_pace_with_the_calls_pacer_and_only_yield_without_one():
    from kdbl_core import pacing

    calls: list[str] = []

    async def pacer() -> None:
        calls.append("paced")

    await pacing.checkpoint()
    token = pacing.use(pacer)
    try:
        await pacing.checkpoint()
    finally:
        pacing.reset(token)
    await pacing.checkpoint()
    assert calls == ["paced"]
