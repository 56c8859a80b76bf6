"""The /mcp front door: its parts stacked, outermost first, each a plain ASGI app over the next.

    opening          OpenCall: the call's Request and Call on the scope, X-Request-Id on every answer;
                     404 while MCP is off, 405 for anything but POST
    authenticate     Authenticate: the bearer token (401, 429, 403)
    tenant_policy    LookUpPolicy: the tenant's policy, from the per-process cache
    envelope         ReadEnvelope: the body within its limits (413, 408), one JSON-RPC message (400)
    permissions      CheckPermissions: disabled tenant, the token's scopes, resources vs the allowlist (403)
    rate_limit       TakeRateLimit: the shared rate-limit buckets (429); the door's `auth` time ends
    slot             TakeSlot: the tenant's fair share of this process (a wait, or 429)
    dispatch         Dispatch: the caller on the scope as the SDK reads it; the body replayed to the SDK's
                     transport, or the request answered by the SDK's single-exchange driver where that is the
                     same answer (kdbl_api.front_door.single_exchange, not a part: a helper of this one)

Like Starlette's middleware and the MCP SDK's auth middleware, each part is a class with an `app` and an
`async __call__(scope, receive, send)` that answers or calls the next; unlike BaseHTTPMiddleware, no part
builds a Request or response stream of its own or starts a task. What the parts learn goes on the call's one
object on the scope (kdbl_api.call_scope.Call), which the MCP handlers read (kdbl_api.call_runner). The order
is the order the checks always ran in, so every status, header, audit row and counter stays as it was.
Measured in process (stub token, policy and limiter lookups, a stub SDK app, 10 x 20,000 tools/call requests
alternating with the one-class door it replaced, kdbl_api.http_auth until issue 33; harness included): 44.0
against 40.0 µs of CPU per request at best, 46.3 against 44.0 µs median — ~2-4 µs, ~0.1% of a 3 ms call:
the eight nested calls (0.15 µs each, measured alone) and the Call (0.3 µs). Neither door leaves an object
in a reference cycle (docs/architecture.md, "The front door as a stack").

`McpFrontDoor` is the composed app and what the rest of the API uses: `authenticate` (the one token check,
also for /capacity and the legacy SSE endpoints), `quota` (/capacity's rate-limit view), its policies,
observability, pool and fair share.
"""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api import fair_share
from kdbl_api.bearer import SdkTokenVerifier
from kdbl_api.front_door.authenticate import Authenticate, Authenticator
from kdbl_api.front_door.dispatch import Dispatch
from kdbl_api.front_door.envelope import ReadEnvelope
from kdbl_api.front_door.opening import OpenCall
from kdbl_api.front_door.permissions import CheckPermissions
from kdbl_api.front_door.rate_limit import TakeRateLimit
from kdbl_api.front_door.refusals import Refusals
from kdbl_api.front_door.single_exchange import SingleExchange
from kdbl_api.front_door.slot import TakeSlot
from kdbl_api.front_door.tenant_policy import LookUpPolicy
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import RateLimiter
from kdbl_core.access.policy import Policies
from kdbl_core.access.principal import Principal
from kdbl_core.db.async_pool import AsyncPool
from kdbl_core.settings import Settings


class McpFrontDoor:
    def __init__(self, sdk_app: ASGIApp, verifier: SdkTokenVerifier, settings: Settings, limiter: RateLimiter,
                 observability: Observability, policies: Policies, pool: AsyncPool,
                 streaming_app: ASGIApp | None = None, share: fair_share.FairShare | None = None,
                 single: SingleExchange | None = None) -> None:
        self.settings = settings
        self.limiter = limiter
        self.obs = observability
        self.policies = policies
        self.pool = pool
        self.share = share if share is not None else fair_share.FairShare(observability, pool_size=pool.size)
        refusals = Refusals(pool, settings)
        self.authenticator = Authenticator(verifier, observability, refusals)
        self.authenticate = self.authenticator.authenticate
        self.dispatch = Dispatch(sdk_app, streaming_app, single)  # its single exchange: tests turn it off
        app: ASGIApp = self.dispatch
        app = TakeSlot(app, self.share, refusals)
        app = TakeRateLimit(app, limiter, observability, refusals)
        app = CheckPermissions(app, observability, refusals)
        app = ReadEnvelope(app, settings, refusals)
        app = LookUpPolicy(app, policies)
        app = Authenticate(app, self.authenticator)
        self.app = OpenCall(app, settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    async def quota(self, principal: Principal) -> dict[str, Any]:
        """/capacity's rate_limit: the caller's tiers (per token, tenant) and what is left of the tightest
        bucket (read without taking anything; null when no tier applies)."""
        policy = await self.policies.get(principal.tenant_id)
        decision = await self.limiter.peek(principal, policy)
        return {**policy.describe()["rate_limit"], "remaining": decision.as_json() if decision else None,
                "scope": "shared by every API replica (token buckets in PostgreSQL)"}
