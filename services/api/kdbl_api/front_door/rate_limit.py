"""The front door's rate-limit part: a call that does work takes from the shared buckets, or is refused 429.

tools/call, tools/list and resources/* take one token from each of the caller's tiers (per token and per
tenant, kdbl_api.ratelimit: buckets in PostgreSQL, shared by every API replica; one statement). Refused:
429 with Retry-After and the RateLimit-* headers, audited `rate_limited`, counted in `rate_limited`. Let
through: the decision is on the call (`Call.decision`), and its RateLimit-* headers go on the answer
(kdbl_api.front_door.dispatch; a fair-share refusal carries them too). initialize, ping and notifications take
nothing. The door's own work ends here: its time so far is the call's `took_ms.auth`.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.refusals import Refusals, jsonrpc
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import RateLimiter
from kdbl_core.errors import RateLimited

COUNTED = frozenset({"tools/call", "tools/list"})  # and resources/*


class TakeRateLimit:
    def __init__(self, app: ASGIApp, limiter: RateLimiter, observability: Observability,
                 refusals: Refusals) -> None:
        self.app = app
        self.limiter = limiter
        self.obs = observability
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        if any(method in COUNTED or method.startswith("resources/") for method, _, _ in call.calls):
            decision = call.decision = await self.limiter.take(call.access.principal, call.policy)
            if decision is not None and not decision.allowed:
                self.obs.rate_limited.inc()
                exc = RateLimited(decision.retry_after_sec)
                await self.refusals.refused(call, "rate_limited", exc.message)
                await jsonrpc(exc, decision.headers())(scope, receive, send)
                return
        call.meta.add("auth", call.meta.started)
        await self.app(scope, receive, send)
