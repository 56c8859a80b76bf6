"""Rate limits shared by every API replica and process: token buckets in PostgreSQL.

A tenant's policy names tiers (per minute, hour, day) for each token and for the tenant as a whole
(kdbl_core.access.policy). Each limited request takes one token from every bucket of its tiers, or from
none, in one statement (`kdbl_rate_take`: an UPSERT that refills the UNLOGGED `rate_buckets` rows,
then one decrement); the database is the shared state, so N replicas × M worker processes enforce
one limit, and a restarted process forgets nothing. A request whose tenant and token name no tier
costs no statement.

Measured on the 2-core dev box (3,000 sequential calls, embedded PostgreSQL 18): one tier costs
164 µs of API CPU and 87 µs of Postgres CPU per call, against 70 / 13 µs for a bare `SELECT 1` round
trip — so ~0.1 ms of API CPU and ~0.09 ms of Postgres CPU added per limited request; six tiers (three
per token, three per tenant) 197 / 103 µs. A search request costs ~10 ms of CPU in all (~200 req/s on
2 cores), so the shared limit adds ~2-3%. A per-replica division was rejected: with several worker
processes per pod and autoscaled pods it never equals the configured limit.

Only requests that do work count: tools/call, tools/list and resources/*; initialize and
notifications never do, so a client can always connect and learn why it is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kdbl_core.access.policy import TenantPolicy, Tier
from kdbl_core.access.principal import Principal
from kdbl_core.db.async_pool import AsyncPool

_TAKE = "SELECT key, remaining, capacity, retry_after FROM kdbl_rate_take(%(keys)s, %(caps)s, %(rates)s)"
_PEEK = "SELECT key, remaining, capacity FROM kdbl_rate_peek(%(keys)s, %(caps)s, %(rates)s)"


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_sec: int
    limit: int  # the most constrained bucket: its size, what is left, seconds until it is full again
    remaining: int
    reset_sec: int
    policy: str  # RateLimit-Policy: '60;w=60, 1000;w=3600'

    def headers(self) -> dict[str, str]:
        out = {"RateLimit-Limit": str(self.limit), "RateLimit-Remaining": str(self.remaining),
               "RateLimit-Reset": str(self.reset_sec), "RateLimit-Policy": self.policy}
        if not self.allowed:
            out["Retry-After"] = str(self.retry_after_sec)
        return out

    def as_json(self) -> dict[str, int | str]:
        return {"limit": self.limit, "remaining": self.remaining, "reset_sec": self.reset_sec,
                "policy": self.policy}


def _holder(principal: Principal) -> str:
    if principal.token_id is not None:
        return f"k:{principal.token_id}"
    return f"s:{principal.tenant_id}:{principal.subject}"  # OIDC: per subject


def buckets(principal: Principal, policy: TenantPolicy) -> list[tuple[str, Tier]]:
    out = [(f"{_holder(principal)}:{t.name}", t) for t in policy.token_tiers]
    out += [(f"t:{principal.tenant_id}:{t.name}", t) for t in policy.tenant_tiers]
    return sorted(out, key=lambda kt: kt[0])


def _params(pairs: list[tuple[str, Tier]]) -> dict[str, list]:
    return {"keys": [k for k, _ in pairs], "caps": [float(t.burst) for _, t in pairs],
            "rates": [t.rate_per_s for _, t in pairs]}


def _decide(pairs: list[tuple[str, Tier]], rows: list) -> Decision:
    tiers = dict(pairs)
    state = {r.key: r for r in rows}
    wait = max(getattr(r, "retry_after", 0.0) or 0.0 for r in rows)

    def reset(key: str) -> int:
        r = state[key]
        return max(0, math.ceil((r.capacity - r.remaining) / tiers[key].rate_per_s))

    tight = min(state, key=lambda k: (math.floor(state[k].remaining), -reset(k)))
    return Decision(allowed=wait <= 0, retry_after_sec=max(1, math.ceil(wait)) if wait > 0 else 0,
                    limit=int(state[tight].capacity), remaining=max(0, math.floor(state[tight].remaining)),
                    reset_sec=reset(tight),
                    policy=", ".join(f"{t.burst};w={t.period_s}" for _, t in pairs))


class RateLimiter:
    def __init__(self, pool: AsyncPool) -> None:
        self._pool = pool

    async def take(self, principal: Principal, policy: TenantPolicy) -> Decision | None:
        """None when no tier applies; otherwise whether the request may pass, with what is left."""
        pairs = buckets(principal, policy)
        if not pairs:
            return None
        rows = await self._pool.fetch(_TAKE, _params(pairs))
        return _decide(pairs, rows)

    async def peek(self, principal: Principal, policy: TenantPolicy) -> Decision | None:
        pairs = buckets(principal, policy)
        if not pairs:
            return None
        rows = await self._pool.fetch(_PEEK, _params(pairs))
        return _decide(pairs, rows)
