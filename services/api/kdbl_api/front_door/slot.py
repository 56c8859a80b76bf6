"""The front door's fair-share part: a call holds its cost in its tenant's slots while it runs.

kdbl_api.fair_share.FairShare counts each tenant's calls in flight in this process, by cost units
(`fair_share.cost`: a bigger search or an abstractive answer costs more; initialize, tools/list and
notifications cost nothing and skip this). A call waits briefly for room (its wait is the call's
`took_ms.queue`) or is refused 429 + Retry-After, audited `rate_limited`, with the rate limiter's headers.
While it runs, its tenant's pacer is installed (kdbl_core.pacing: a call's checkpoints yield to lighter
tenants), and its slots are given back once it is answered, whatever happened.
"""

from __future__ import annotations

import time
from functools import partial

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api import fair_share
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.refusals import Refusals, jsonrpc
from kdbl_core import pacing
from kdbl_core.errors import RateLimited


class TakeSlot:
    def __init__(self, app: ASGIApp, share: fair_share.FairShare, refusals: Refusals) -> None:
        self.app = app
        self.share = share
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        units = sum(fair_share.cost(method, tool, arguments) for method, tool, arguments in call.calls)
        if not units:
            await self.app(scope, receive, send)
            return
        principal, queued = call.access.principal, time.perf_counter()
        try:
            slot = await self.share.acquire(principal.tenant_id, principal.tenant_name, units,
                                            call.policy.limits)
        except RateLimited as exc:  # the tenant's slots stayed full: 429 + Retry-After, audited
            await self.refusals.refused(call, "rate_limited", exc.message)
            await jsonrpc(exc, call.decision.headers() if call.decision else None)(scope, receive, send)
            return
        if slot.waited_s:
            call.meta.add("queue", queued)
        paced = pacing.use(partial(self.share.defer, principal.tenant_id))
        try:
            await self.app(scope, receive, send)
        finally:
            pacing.reset(paced)
            slot.release()
