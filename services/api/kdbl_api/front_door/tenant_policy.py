"""The front door's tenant-policy part: the caller's tenant's policy on the call (`Call.policy`).

kdbl_core.access.policy.Policies answers from its per-process cache (at most its TTL, 2 s, old), so most calls
cost no round trip here. The policy is looked up before the body is read, as it always was (a database that
went away answers 503 before a slow body is waited for); what it refuses — a disabled tenant, a tool or
resources outside its allowlist — is refused after the message is parsed (kdbl_api.front_door.permissions), so
the refusal's audit row names the tool.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api.call_scope import KEY, Call
from kdbl_core.access.policy import Policies


class LookUpPolicy:
    def __init__(self, app: ASGIApp, policies: Policies) -> None:
        self.app = app
        self.policies = policies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        call.policy = await self.policies.get(call.access.principal.tenant_id)
        await self.app(scope, receive, send)
