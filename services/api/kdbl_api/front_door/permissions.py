"""The front door's permission part: what the tenant's policy and the token's scopes allow this call.

In this order, each refusal audited as `denied` with the request's tool: a disabled tenant's tokens get 403
(`data.tenant_disabled`, counted in `auth_failures{forbidden}`); a token without the scope the call needs gets
403 `insufficient_scope` with its challenge (kdbl_api.scope_check, the one scope check, asked once from the
message already parsed); resources/* get 403 unless the tenant's tool allowlist has get_file_text (a resource
read is get_file_text by another name). A tool outside the allowlist passes here: the SDK layer refuses it as
an unknown tool.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api import scope_check
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.refusals import Refusals, disabled_message, jsonrpc
from kdbl_api.observability import Observability
from kdbl_core.errors import Forbidden


class CheckPermissions:
    def __init__(self, app: ASGIApp, observability: Observability, refusals: Refusals) -> None:
        self.app = app
        self.obs = observability
        self.refusals = refusals

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        principal, policy, calls = call.access.principal, call.policy, call.calls
        if not policy.enabled:
            self.obs.auth_failures.labels("forbidden").inc()
            message = disabled_message(principal.tenant_name)
            await self.refusals.refused(call, "denied", message)
            await jsonrpc(Forbidden(message, data={"tenant_disabled": True}))(scope, receive, send)
            return
        missing = scope_check.missing_scope(calls, principal.scopes, policy)
        if missing:
            refusal = scope_check.refusal(missing)
            await self.refusals.refused(call, "denied", refusal.message)
            await jsonrpc(refusal, {"WWW-Authenticate": self.refusals.challenge(
                call.request, "insufficient_scope", None, missing)})(scope, receive, send)
            return
        if not policy.allows_tool("get_file_text") and any(m.startswith("resources/") for m, _, _ in calls):
            message = ("resources are not available to this tenant (get_file_text is not in its tool "
                       "allowlist)")
            await self.refusals.refused(call, "denied", message)
            await jsonrpc(Forbidden(message))(scope, receive, send)
            return
        await self.app(scope, receive, send)
