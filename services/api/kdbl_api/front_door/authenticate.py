"""Bearer authentication: the one check of every route that takes a token, and the front door's part for it.

`Authenticator.authenticate` verifies the request's `Authorization: Bearer` token through
kdbl_api.bearer.SdkTokenVerifier (PATs and OIDC) or says what to answer instead: 401 with the RFC 9728
challenge (no token: `auth_failures{missing}`; a bad one: `invalid`, with `error="invalid_token"` and the
reason), 429 + Retry-After while a lookup id's argon2 budget is spent (`throttled`), 403 for a cluster-admin
token (`forbidden`). A refused token that names a known tenant (`TokenRefused`: revoked, expired) is audited
as `unauthenticated`. /mcp, the legacy SSE endpoints and /capacity all authenticate here, so all refuse
alike; a plain HTTP route (`route=`) gets `{"error": ...}` bodies and its audit rows name it.

`Authenticate`, the part, puts the verified token on the call (`Call.access`, which carries the principal);
it is put on the scope as the SDK reads it (`scope["user"]`) only once every check has passed
(kdbl_api.front_door.dispatch).
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from kdbl_api.bearer import PrincipalToken, SdkTokenVerifier
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.refusals import Refusals, jsonrpc, plain
from kdbl_api.observability import Observability
from kdbl_core.access.principal import Principal
from kdbl_core.access.tokens import TokenRefused
from kdbl_core.errors import Forbidden, RateLimited, Unauthenticated


class Authenticator:
    def __init__(self, verifier: SdkTokenVerifier, observability: Observability, refusals: Refusals) -> None:
        self.verifier = verifier
        self.obs = observability
        self.refusals = refusals

    async def authenticate(self, request: Request, *, route: str | None = None) -> PrincipalToken | Response:
        """The request's bearer token verified, or the refusal to send (counted; a known token's audited)."""
        refuse = jsonrpc if route is None else plain
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self.obs.auth_failures.labels("missing").inc()
            return refuse(Unauthenticated("authentication required: send Authorization: Bearer <token>"),
                          {"WWW-Authenticate": self.refusals.challenge(request)})
        started = time.perf_counter()
        try:
            return await self.verifier.authenticate(token.strip())
        except TokenRefused as exc:  # a known token of a known tenant: audited
            self.obs.auth_failures.labels("invalid").inc()
            if exc.tenant_id is not None:
                who = Principal(tenant_id=exc.tenant_id, tenant_name=exc.tenant_name, subject=exc.subject,
                                token_id=exc.token_id)
                await self.refusals.audit(request, who, [(route, route, {})] if route else [],
                                          "unauthenticated", exc.message, started)
            return refuse(exc, {"WWW-Authenticate": self.refusals.challenge(request, "invalid_token",
                                                                            exc.message)})
        except Unauthenticated as exc:
            self.obs.auth_failures.labels("invalid").inc()
            return refuse(exc, {"WWW-Authenticate": self.refusals.challenge(request, "invalid_token",
                                                                            exc.message)})
        except RateLimited as exc:
            self.obs.auth_failures.labels("throttled").inc()
            return refuse(exc)
        except Forbidden as exc:
            self.obs.auth_failures.labels("forbidden").inc()
            return refuse(exc)


class Authenticate:
    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: Call = scope[KEY]
        access = await self.authenticator.authenticate(call.request)
        if isinstance(access, Response):
            await access(scope, receive, send)
            return
        call.access = access
        await self.app(scope, receive, send)
