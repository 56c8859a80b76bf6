"""Each tenant's policy as this process sees it: tenants.settings, re-read after `TTL_S` seconds.

A change (operator or `kdbl-control tenant update`) takes effect on every running replica within
`TTL_S` without a restart; the read is one statement per tenant per process per `TTL_S` (nothing on
the request path in between). Two seconds bounds how long a disabled tenant keeps working.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from uuid import UUID

from kdbl_core import policy
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.policy import TenantPolicy
from kdbl_core.settings import Settings

TTL_S = 2.0
_READ = "SELECT settings FROM kdbl_tenant_settings(%(tenant)s)"


class Policies:
    def __init__(self, pool: AsyncPool, settings: Settings, *, ttl_s: float = TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._pool, self._ttl, self._clock = pool, ttl_s, clock
        self._defaults = {"default_per_minute": settings.rate_limit_per_minute,
                          "default_burst": settings.rate_limit_burst}
        self._cache: dict[UUID, tuple[float, TenantPolicy]] = {}

    async def get(self, tenant_id: UUID) -> TenantPolicy:
        hit = self._cache.get(tenant_id)
        now = self._clock()
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        rows = await self._pool.fetch(_READ, {"tenant": tenant_id})
        parsed = policy.parse(rows[0].settings if rows else None, **self._defaults)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[tenant_id] = (now, parsed)
        return parsed
