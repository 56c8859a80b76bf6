"""Driving one part of the /mcp front door (kdbl_api.front_door) as a plain ASGI app, in process.

`drive` sends one request through an app and returns what it answered; `Downstream` is the next app, which
records the call it was handed; the doubles stand in for our own lookups (token verifier, policies, rate
limiter) and for the refusals' audit write, so that a part's tests need no database. The whole door over
real tokens, policies, buckets and audit rows is tested through HTTP in tests/integration.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kdbl_api.bearer import PrincipalToken, access_token_of
from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.envelope import calls_of
from kdbl_api.front_door.refusals import Refusals
from kdbl_api.ratelimit import Decision
from kdbl_api.request_meta import CallMeta
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import ALL_SCOPES, Principal
from kdbl_core.errors import Unauthenticated
from kdbl_core.settings import Settings

PUBLIC = "http://public.example:8443"
SETTINGS = Settings(mcp_enabled=True, api_public_url=PUBLIC, max_request_bytes=4096, body_read_timeout_s=1.0)


def principal(*scopes: str, tenant: str = "acme") -> Principal:
    return Principal(tenant_id=uuid.uuid4(), tenant_name=tenant, subject="user:ada",
                     scopes=frozenset(scopes or ALL_SCOPES), token_id=uuid.uuid4())


def rpc(method: str, params: dict[str, Any] | None = None, request_id: int | None = 7) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        message["id"] = request_id
    if params is not None:
        message["params"] = params
    return message


def tool_call(name: str, arguments: dict[str, Any] | None = None, **params: Any) -> dict[str, Any]:
    return rpc("tools/call", {"name": name, "arguments": arguments or {}, **params})


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        found = [v for k, v in self.headers if k == name.lower()]
        return found[-1] if found else None

    def json(self) -> Any:
        return json.loads(self.body)


def scope_of(method: str = "POST", headers: dict[str, str] | None = None, call: Call | None = None,
             client: tuple[str, int] = ("127.0.0.1", 5000)) -> dict[str, Any]:
    scope: dict[str, Any] = {
        "type": "http", "method": method, "path": "/mcp", "raw_path": b"/mcp", "query_string": b"",
        "root_path": "", "scheme": "http", "server": ("api.internal", 8080), "client": client,
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
    if call is not None:
        scope[KEY] = call
    return scope


async def drive(app: Any, scope: dict[str, Any], body: bytes | list[bytes] = b"") -> Answer:
    """`app` over one request whose body arrives as `body` (a list: in those chunks); what it answered."""
    chunks = body if isinstance(body, list) else [body]
    pending = list(enumerate(chunks))
    started: dict[str, Any] = {}
    parts: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if pending:
            i, chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.update(message)
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    headers = [(k.decode().lower(), v.decode()) for k, v in started.get("headers", [])]
    return Answer(started.get("status", 0), headers, b"".join(parts))


def opened(who: Principal | None = None, *, policy: TenantPolicy | None = None,
           message: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
           decision: Decision | None = None) -> tuple[dict[str, Any], Call]:
    """A scope as the parts before the one under test leave it: the call opened, authenticated, its policy
    looked up and its message parsed, as far as the arguments go."""
    call = Call(CallMeta.begin())
    scope = scope_of(headers=headers, call=call)
    call.request = Request(scope)
    call.access = access_token_of(who) if who is not None else None
    call.policy = policy
    if message is not None:
        call.message, call.body, call.calls = message, json.dumps(message).encode(), calls_of(message)
    call.decision = decision
    return scope, call


def reading(app: Any) -> Any:
    """`app` behind what the door's first part does for it: the call's Request over this receive (the one
    that reads the body)."""

    async def with_request(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[KEY].request = Request(scope, receive)
        await app(scope, receive, send)

    return with_request


@dataclass
class Downstream:
    """The next app: answers 200 `{"ok": true}` and records the call (and the scope) it was handed."""

    reached: list[dict[str, Any]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.reached.append(scope)
        message = await receive()
        self.bodies.append(message.get("body", b""))
        await Response(b'{"ok": true}', media_type="application/json")(scope, receive, send)

    @property
    def call(self) -> Call:
        return self.reached[-1][KEY]


class RecordingRefusals(Refusals):
    """The real refusals (challenge, audit row) with the row recorded instead of written to the database."""

    def __init__(self, settings: Settings = SETTINGS) -> None:
        super().__init__(pool=None, settings=settings)  # type: ignore[arg-type] - nothing is written
        self.rows: list[dict[str, Any]] = []

    async def write(self, principal: Principal, row: dict[str, Any]) -> None:
        self.rows.append(row)


class Verifier:
    """kdbl_api.bearer.SdkTokenVerifier's `authenticate`: a known token's principal, or what `refuse`
    raises for it."""

    def __init__(self, tokens: dict[str, Principal], refuse: dict[str, Exception] | None = None) -> None:
        self.tokens, self.refuse = tokens, refuse or {}

    async def authenticate(self, token: str) -> PrincipalToken:
        if token in self.refuse:
            raise self.refuse[token]
        if token in self.tokens:
            return access_token_of(self.tokens[token])
        raise Unauthenticated("invalid token")


class Policies:
    """kdbl_core.access.policy.Policies' `get`: one policy per tenant id, the default otherwise."""

    def __init__(self, policies: dict[uuid.UUID, TenantPolicy] | None = None) -> None:
        self.policies = policies or {}
        self.asked: list[uuid.UUID] = []

    async def get(self, tenant_id: uuid.UUID) -> TenantPolicy:
        self.asked.append(tenant_id)
        return self.policies.get(tenant_id, TenantPolicy())


class Limiter:
    """kdbl_api.ratelimit.RateLimiter's `take`: the decision given (None: no tier applies)."""

    def __init__(self, decision: Decision | None) -> None:
        self.decision = decision
        self.taken: list[Principal] = []

    async def take(self, who: Principal, policy: TenantPolicy) -> Decision | None:
        self.taken.append(who)
        return self.decision
