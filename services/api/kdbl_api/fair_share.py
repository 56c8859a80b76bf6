"""Fair share between tenants: a bound on each tenant's calls in flight in this API process, by cost.

Measured before (issue 27 §3, the 2-core reference box): under another tenant's heavy but allowed calls
(search limit 100 with long queries, `answer` with 4,096 tokens, `find_similar` of 20,000 characters) a
quiet tenant's search p95 went from 152 ms to 2,126 ms, and was still ~5x with a 120/min tenant rate
tier: a rate limit bounds calls per minute, not how many run at once, and a few expensive calls at once
take both cores and most of the database pool.

So each tenant has `max_in_flight` cost units per process (its policy's concurrency, else
KDBL_TENANT_MAX_IN_FLIGHT = 4). A call takes `cost(...)` units before the SDK sees it and gives them back
when its answer is sent; a call that does not fit waits first come, first served up to `queue_ms`
(KDBL_TENANT_QUEUE_S = 2 s), then is refused with 429 + Retry-After and a JSON-RPC RATE_LIMITED error
(kdbl_core.errors.RateLimited), audited `rate_limited` by the front door, as the rate limit's refusals
are. Waiting costs nothing on the database: a waiting call holds no connection.

The pool: a call holds one database connection at a time (its RLS transaction; a failed call's audit
row after that one is back), and a call costs at least one unit, so a tenant holds at most its limit of
connections. The limit is clamped to KDBL_DB_POOL_SIZE - 1: one tenant never holds every connection, and
with the defaults (pool 10, limit 4) two saturating tenants leave two connections to everybody else.

Costs (units, clamped to the tenant's limit so that any call can run alone), from what each call costs
on the reference box (docs/benchmarks.md): a search ~15 ms of database time, an extractive answer ~33 ms
(a search plus reading and scoring 8 chunks), a lexical more-like-this ~50 ms; an abstractive answer's
generation keeps both cores busy for seconds (KDBL_CHAT_THREADS = 2). A search's cost grows with its
result (limit > 50: previews, snippets and fields of up to 100 hits) and with its query's terms (> 200
characters: more posting lists read); find_similar's text subject is embedded and searched by its terms.
tools/list, initialize and notifications do no database work and cost nothing (never wait, never
refused here). `kdbl-control bench fairness` measures the quiet tenant's p95 beside a noisy one.

Slots bound how many calls a tenant runs, not how much of the process's single event loop they take: with
the neighbour held to one call at a time the quiet tenant's p95 was still ~3-4x its p95 alone, each of its
steps queued behind a step of the neighbour's long call (window and snippet assembly of 100 hits, the
result's rendering). So a call also paces itself (`defer`, the pacer behind kdbl_core.pacing's
checkpoints, which long core loops and the call runner pass): a tenant whose recent use of this process
(units in flight, decayed over ~1 s) is more than twice another's lets that tenant's call in flight go
first, for at most DEFER_MAX_S per checkpoint. Measured (`bench fairness`, SciFact, 2 cores): the quiet
tenant's p95 ratio went from 8.5x without fair share and 3.0-3.6x with slots alone to 1.6-1.9x.

Per process, not shared by replicas: in-flight work is a property of each process's own cores and pool;
a cluster-wide count would cost a database round trip per call for nothing the pool bound needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from kdbl_api.observability import Observability
from kdbl_core.access.policy import Limits
from kdbl_core.errors import RateLimited

RETRY_AFTER_S = 1
USAGE_TAU_S = 1.0  # a tenant's recent use of this process: units in flight, decayed over about a second
LIGHTER = 0.5  # another tenant is lighter when its recent use is under half of this one's
DEFER_MAX_S = 0.05  # the longest a checkpoint holds a heavier tenant's call back (it still progresses)
FORGET_BELOW = 0.01  # unit-seconds: an idle tenant's record is dropped once its use decayed below this
MAX_WAITING = 256  # calls of one tenant waiting at once; one more is refused at once ("queue_full")
BIG_LIMIT = 50
LONG_QUERY_CHARS = 200
LONG_TEXT_CHARS = 2000
VERY_LONG_TEXT_CHARS = 8000


def _len(value: Any) -> int:
    return len(value) if isinstance(value, (str, list)) else 0


def _big(arguments: Mapping[str, Any]) -> int:
    limit = arguments.get("limit")
    return int(isinstance(limit, int) and limit > BIG_LIMIT)


def cost(method: str, tool: str, arguments: Any) -> int:
    """A call's units (see the module docstring); 0 for what is never limited."""
    if method.startswith("resources/"):
        return 1
    if method != "tools/call":
        return 0
    args = arguments if isinstance(arguments, Mapping) else {}
    if tool == "search_content":
        return 1 + _big(args) + int(_len(args.get("query")) > LONG_QUERY_CHARS)
    if tool == "answer":
        return 4 if args.get("answer_type") == "abstractive" else 2
    if tool == "find_similar":
        subject = args.get("subject") if isinstance(args.get("subject"), Mapping) else {}
        text = _len(subject.get("text"))
        return 1 + _big(args) + int(text > LONG_TEXT_CHARS) + int(text > VERY_LONG_TEXT_CHARS)
    if tool == "get_contents":
        expand = args.get("expand") if isinstance(args.get("expand"), Mapping) else {}
        return 1 + int(_len(args.get("ids")) > 25) + int(bool(expand.get("graph")))
    if tool == "find_entity":  # full: up to 100 entities, 500 relationships and their evidence
        return 2 if args.get("response_mode") == "full" else 1
    return 1


@dataclass(slots=True)
class _Waiter:
    units: int
    granted: asyncio.Future[None]


@dataclass(slots=True)
class _Tenant:
    limit: int
    in_use: int = 0
    waiting: deque[_Waiter] = field(default_factory=deque)
    usage: float = 0.0  # unit-seconds in flight, exponentially decayed (USAGE_TAU_S), as of `stamp`
    stamp: float = 0.0

    def used(self, now: float) -> float:
        """Recent use as of `now` (the units in flight since `stamp` added)."""
        decay = math.exp(-(now - self.stamp) / USAGE_TAU_S)
        return self.usage * decay + self.in_use * USAGE_TAU_S * (1 - decay)

    def settle(self, now: float) -> None:
        self.usage, self.stamp = self.used(now), now


class Slot:
    """Units held by one call; `release` gives them back (once)."""

    __slots__ = ("_share", "_tenant_id", "units", "waited_s")

    def __init__(self, share: FairShare, tenant_id: UUID, units: int, waited_s: float) -> None:
        self._share, self._tenant_id, self.units, self.waited_s = share, tenant_id, units, waited_s

    def release(self) -> None:
        if self.units:
            units, self.units = self.units, 0
            self._share._release(self._tenant_id, units)


class FairShare:
    """Each tenant's units in flight in this process (one event loop: no locks)."""

    def __init__(self, observability: Observability, *, pool_size: int, max_waiting: int = MAX_WAITING,
                 defer_max_s: float = DEFER_MAX_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._obs = observability
        self._defer_max_s, self._clock = defer_max_s, clock
        self._cap = max(1, pool_size - 1)
        self._max_waiting = max_waiting
        self._tenants: dict[UUID, _Tenant] = {}
        self._released = asyncio.Event()  # pulsed at every release: a deferred call looks again

    def limit(self, limits: Limits) -> int:
        """The tenant's units in this process: its policy's, at most the pool's size - 1."""
        return max(1, min(limits.max_in_flight, self._cap))

    def in_flight(self, tenant_id: UUID) -> int:
        tenant = self._tenants.get(tenant_id)
        return tenant.in_use if tenant is not None else 0

    async def acquire(self, tenant_id: UUID, tenant_name: str, units: int, limits: Limits) -> Slot:
        """`units` of the tenant's slots, at once or after waiting up to limits.queue_ms; RateLimited
        (429 + Retry-After) when they stay taken."""
        limit = self.limit(limits)
        units = max(1, min(units, limit))
        tenant = self._tenants.get(tenant_id)
        if tenant is None:
            tenant = self._tenants[tenant_id] = _Tenant(limit, stamp=self._clock())
        tenant.limit = limit  # a changed policy applies from the next call on
        if not tenant.waiting and tenant.in_use + units <= limit:
            self._take(tenant, units)
            return Slot(self, tenant_id, units, 0.0)
        if limits.queue_ms <= 0 or len(tenant.waiting) >= self._max_waiting:
            self._forget_if_idle(tenant_id)
            raise self._refusal(tenant_name, tenant, units, "queue_full" if limits.queue_ms > 0 else "full")
        waiter = _Waiter(units, asyncio.get_running_loop().create_future())
        tenant.waiting.append(waiter)
        self._obs.slots_waiting.inc()
        started = time.perf_counter()
        try:
            await asyncio.wait((waiter.granted,), timeout=limits.queue_ms / 1000)
        except BaseException:  # cancelled while waiting (the client went away): give back what it got
            self._withdraw(tenant_id, tenant, waiter)
            raise
        if not waiter.granted.done():
            self._withdraw(tenant_id, tenant, waiter)
            raise self._refusal(tenant_name, tenant, units, "full")
        waited = time.perf_counter() - started
        self._obs.slot_wait.observe(waited)
        return Slot(self, tenant_id, units, waited)

    async def defer(self, tenant_id: UUID) -> None:
        """A checkpoint of this tenant's call (kdbl_core.pacing): while a lighter tenant (under LIGHTER of
        this one's recent use) has a call in flight, wait for it to end, at most DEFER_MAX_S; then yield.

        Slots bound how many calls a tenant runs, not how much of the process's one event loop they take:
        with its neighbour held to one call at a time, a quiet tenant's p95 was still ~4x its p95 alone,
        each of its steps queued behind a step of the neighbour's long call. Deferring at checkpoints
        hands the loop to the lighter call first; the heavier one goes on when it ends or after the bound."""
        loop = asyncio.get_running_loop()
        until = loop.time() + self._defer_max_s
        while (left := until - loop.time()) > 0 and self._lighter_busy(tenant_id):
            released = self._released
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(released.wait(), left)
        await asyncio.sleep(0)

    def _lighter_busy(self, tenant_id: UUID) -> bool:
        me = self._tenants.get(tenant_id)
        if me is None or len(self._tenants) < 2:
            return False
        now = self._clock()
        mine = me.used(now)
        return any(other.in_use and other.used(now) < LIGHTER * mine
                   for key, other in self._tenants.items() if key != tenant_id)

    def _take(self, tenant: _Tenant, units: int) -> None:
        tenant.settle(self._clock())
        before = tenant.in_use
        tenant.in_use += units
        self._obs.slots_in_use.inc(units)
        if before < tenant.limit <= tenant.in_use:
            self._obs.slots_full.inc()

    def _release(self, tenant_id: UUID, units: int) -> None:
        tenant = self._tenants[tenant_id]
        tenant.settle(self._clock())
        before = tenant.in_use
        tenant.in_use -= units
        self._obs.slots_in_use.dec(units)
        if tenant.in_use < tenant.limit <= before:
            self._obs.slots_full.dec()
        self._grant(tenant)
        self._forget_if_idle(tenant_id)
        self._released.set()
        self._released = asyncio.Event()

    def _grant(self, tenant: _Tenant) -> None:
        """Wake waiters in order while the first fits (strict FIFO: a big call is not starved by small ones)."""
        while tenant.waiting and tenant.in_use + tenant.waiting[0].units <= tenant.limit:
            waiter = tenant.waiting.popleft()
            self._obs.slots_waiting.dec()
            self._take(tenant, waiter.units)
            waiter.granted.set_result(None)

    def _withdraw(self, tenant_id: UUID, tenant: _Tenant, waiter: _Waiter) -> None:
        if waiter.granted.done():  # granted as it gave up: hand the units on
            self._release(tenant_id, waiter.units)
            return
        tenant.waiting.remove(waiter)
        self._obs.slots_waiting.dec()
        waiter.granted.cancel()
        self._grant(tenant)  # the first waiter may have been the one that did not fit
        self._forget_if_idle(tenant_id)

    def _forget_if_idle(self, tenant_id: UUID) -> None:
        """Drop the records of idle tenants whose recent use has decayed away (this one's, and any other's)."""
        now = self._clock()
        for key in [tenant_id, *self._tenants] if len(self._tenants) > 1 else [tenant_id]:
            tenant = self._tenants.get(key)
            if tenant is not None and tenant.in_use == 0 and not tenant.waiting \
                    and tenant.used(now) < FORGET_BELOW:
                del self._tenants[key]

    def _refusal(self, tenant_name: str, tenant: _Tenant, units: int, reason: str) -> RateLimited:
        self._obs.slots_refused.labels(reason).inc()
        exc = RateLimited(RETRY_AFTER_S, (
            f"tenant '{tenant_name}' has {tenant.in_use} of its {tenant.limit} call slots in use on this server "
            f"and this call needs {units}; retry after {RETRY_AFTER_S} s (fewer calls at once, or an administrator "
            f"raises it: kdbl-control tenant update {tenant_name} --max-in-flight N)"))
        exc.data.update(in_flight=tenant.in_use, max_in_flight=tenant.limit, cost=units)
        return exc
