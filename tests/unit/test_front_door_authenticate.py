"""kdbl_api.front_door.authenticate in process: the one bearer check (401 with its challenge, 429, 403, a
known token's refusal audited, every refusal counted; JSON-RPC on /mcp, `{"error": ...}` on a plain route)
and the part that puts the verified token on the call."""

from __future__ import annotations

import uuid

from front_door_doubles import PUBLIC, Downstream, RecordingRefusals, Verifier, drive, principal, scope_of
from starlette.requests import Request

from kdbl_api.call_scope import KEY, Call
from kdbl_api.front_door.authenticate import Authenticate, Authenticator
from kdbl_api.observability import Observability
from kdbl_api.request_meta import CallMeta
from kdbl_core.access.tokens import TokenRefused
from kdbl_core.errors import Forbidden, RateLimited

ADA = principal()
GONE = TokenRefused("token revoked", tenant_id=ADA.tenant_id, tenant_name="acme", subject="user:ada",
                    token_id=uuid.uuid4())
STRANGER = TokenRefused("token revoked", tenant_id=None, tenant_name="", subject="", token_id=uuid.uuid4())
METADATA = f'resource_metadata="{PUBLIC}/.well-known/oauth-protected-resource/mcp"'


def _door() -> tuple[Authenticator, Observability, RecordingRefusals]:
    obs, refusals = Observability(), RecordingRefusals()
    verifier = Verifier({"good": ADA}, {"gone": GONE, "stranger": STRANGER, "busy": RateLimited(9),
                                        "admin": Forbidden("cluster-admin tokens do not call tools")})
    return Authenticator(verifier, obs, refusals), obs, refusals


def _failures(obs: Observability, reason: str) -> float:
    return obs.registry.get_sample_value("kdbl_auth_failures_total", {"reason": reason}) or 0.0


def _opened(token: str | None) -> dict:
    scope = scope_of(headers={"Authorization": f"Bearer {token}"} if token else {},
                     call=Call(CallMeta(request_id="req-1")))
    scope[KEY].request = Request(scope)
    return scope


async def test_a_verified_token_goes_on_the_call_and_not_yet_on_the_scope_for_the_sdk():
    authenticator, obs, refusals = _door()
    nxt = Downstream()
    answer = await drive(Authenticate(nxt, authenticator), _opened("good"))
    assert answer.status == 200 and nxt.call.principal == ADA and nxt.call.access.principal is ADA
    assert "user" not in nxt.reached[0]  # only once every check passed (front_door.dispatch)
    assert refusals.rows == [] and _failures(obs, "missing") == _failures(obs, "invalid") == 0


async def test_no_token_is_401_with_the_challenge_naming_the_resource_metadata_and_counted():
    authenticator, obs, refusals = _door()
    nxt = Downstream()
    for scope in (_opened(None), _opened("")):
        answer = await drive(Authenticate(nxt, authenticator), scope)
        assert answer.status == 401 and answer.json()["error"]["code"] == -32001
        assert answer.json()["error"]["message"] == (
            "authentication required: send Authorization: Bearer <token>")
        assert answer.header("www-authenticate") == f'Bearer realm="kdbl", {METADATA}'
    assert _failures(obs, "missing") == 2 and nxt.reached == [] and refusals.rows == []


async def test_a_bad_token_is_401_invalid_token_with_its_reason():
    authenticator, obs, refusals = _door()
    answer = await drive(Authenticate(Downstream(), authenticator), _opened("nope"))
    assert answer.status == 401 and answer.json()["error"]["message"] == "invalid token"
    assert answer.header("www-authenticate") == (
        f'Bearer realm="kdbl", error="invalid_token", error_description="invalid token", {METADATA}')
    assert _failures(obs, "invalid") == 1 and refusals.rows == []


async def test_a_known_tokens_refusal_is_audited_with_its_tenant_and_the_calls_request_id():
    authenticator, obs, refusals = _door()
    answer = await drive(Authenticate(Downstream(), authenticator), _opened("gone"))
    assert answer.status == 401 and 'error_description="token revoked"' in answer.header("www-authenticate")
    [row] = refusals.rows
    assert (row["tenant_id"], row["token_id"], row["principal"]) == (ADA.tenant_id, GONE.token_id, "user:ada")
    assert (row["tool"], row["status"], row["error"]) == ("mcp", "unauthenticated", "token revoked")
    assert row["request_id"] == "req-1" and row["client_ip"] == "127.0.0.1"
    await drive(Authenticate(Downstream(), authenticator), _opened("stranger"))  # no tenant: nothing to audit
    assert len(refusals.rows) == 1 and _failures(obs, "invalid") == 2


async def test_a_spent_argon2_budget_is_429_and_an_admin_token_403_each_counted():
    authenticator, obs, _ = _door()
    busy = await drive(Authenticate(Downstream(), authenticator), _opened("busy"))
    assert busy.status == 429 and busy.header("retry-after") == "9"
    assert busy.header("www-authenticate") is None
    admin = await drive(Authenticate(Downstream(), authenticator), _opened("admin"))
    assert admin.status == 403
    assert admin.json()["error"]["message"] == "cluster-admin tokens do not call tools"
    assert _failures(obs, "throttled") == _failures(obs, "forbidden") == 1


async def test_a_plain_route_gets_plain_error_bodies_and_its_audit_rows_name_it():
    authenticator, _, refusals = _door()
    missing = await authenticator.authenticate(Request(scope_of(method="GET")), route="/capacity")
    assert missing.status_code == 401 and missing.body == (
        b'{"error":"authentication required: send Authorization: Bearer <token>"}')
    assert missing.headers["www-authenticate"] == f'Bearer realm="kdbl", {METADATA}'
    gone = await authenticator.authenticate(Request(scope_of(headers={"Authorization": "Bearer gone"})),
                                            route="/capacity")
    assert gone.status_code == 401 and gone.body == b'{"error":"token revoked"}'
    [row] = refusals.rows
    assert (row["tool"], row["status"], row["request_id"]) == ("/capacity", "unauthenticated", None)
    verified = await authenticator.authenticate(Request(scope_of(headers={"Authorization": "Bearer good"})),
                                                route="/capacity")
    assert verified.principal == ADA
