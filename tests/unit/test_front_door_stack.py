"""kdbl_api.front_door.McpFrontDoor in process: the parts in the order the checks always ran, one typed call
on the scope for the MCP handlers (kdbl_api.call_runner reads principal, policy and meta from it), and the
request id on every answer. Refusals with their audit rows and the SDK behind the door are tested through
HTTP in tests/integration (test_front_door_pieces, test_request_meta, test_tenant_policy, ...)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from front_door_doubles import (
    SETTINGS, Downstream, Limiter, Policies, Verifier, drive, principal, rpc, scope_of, tool_call,
)
from mcp.shared.exceptions import MCPError
from starlette.requests import Request

from kdbl_api.call_runner import meta_of, policy_of, principal_of
from kdbl_api.call_scope import KEY, Call
from kdbl_api.fair_share import FairShare
from kdbl_api.front_door import McpFrontDoor
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import Decision
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.errors import Unavailable

ADA = principal()
AUTH = {"Authorization": "Bearer good", "X-Request-Id": "stack-1"}
SEARCH = json.dumps(tool_call("search_content", {"query": "okapi"})).encode()


def _door(policies=None, decision=Decision(True, 0, 60, 59, 1, "60;w=60")):
    obs, sdk = Observability(), Downstream()
    door = McpFrontDoor(sdk, Verifier({"good": ADA}), SETTINGS, Limiter(decision), obs,
                        policies or Policies(), pool=None, share=FairShare(obs, pool_size=10))
    return door, sdk


def _ctx(scope):
    return SimpleNamespace(request=Request(scope))


async def test_a_call_through_every_part_reaches_the_sdk_with_one_call_object_the_handlers_read():
    strict = TenantPolicy(tools=frozenset({"search_content"}))
    door, sdk = _door(Policies({ADA.tenant_id: strict}))
    answer = await drive(door, scope_of(headers=AUTH), SEARCH)
    assert answer.status == 200 and answer.header("x-request-id") == "stack-1"
    assert answer.header("ratelimit-remaining") == "59" and sdk.bodies == [SEARCH]
    scope = sdk.reached[0]
    call = scope[KEY]
    assert isinstance(call, Call) and call.calls == [("tools/call", "search_content", {"query": "okapi"})]
    assert principal_of(_ctx(scope)) == ADA and policy_of(_ctx(scope)) is strict
    assert meta_of(_ctx(scope)) is call.meta and set(call.meta.took_ms) == {"auth"}
    assert scope["user"].access_token.principal == ADA  # as the SDK reads it
    assert call.request is None and door.share.in_flight(ADA.tenant_id) == 0


async def test_without_the_door_the_handlers_find_no_principal_the_default_policy_and_a_meta_of_their_own():
    scope = scope_of()
    with pytest.raises(MCPError):
        principal_of(_ctx(scope))
    assert policy_of(_ctx(scope)) == TenantPolicy()
    meta = meta_of(_ctx(scope))
    assert scope[KEY].meta is meta and meta_of(_ctx(scope)) is meta


async def test_the_token_is_checked_before_the_policy_and_the_policy_before_the_body_is_read():
    policies = Policies()
    door, sdk = _door(policies)
    assert (await drive(door, scope_of(headers={"X-Request-Id": "r"}), SEARCH)).status == 401
    assert policies.asked == []

    class Down(Policies):
        async def get(self, tenant_id):
            raise Unavailable("database unreachable", retry_after_sec=2)

    door, sdk = _door(Down())
    read = []

    async def receive():
        read.append(True)
        return {"type": "http.request", "body": SEARCH, "more_body": False}

    async def send(message):
        pass

    with pytest.raises(Unavailable):  # the app's handler answers 503
        await door(scope_of(headers=AUTH), receive, send)
    assert read == []


async def test_the_body_limit_comes_before_the_tenants_refusals():
    door, sdk = _door(Policies({ADA.tenant_id: TenantPolicy(enabled=False)}))
    big = json.dumps(rpc("ping", {"pad": "x" * 5000})).encode()
    assert (await drive(door, scope_of(headers=AUTH), big)).status == 413
    assert sdk.reached == []


async def test_the_door_exposes_the_one_token_check_for_other_routes():
    door, _ = _door()
    verified = await door.authenticate(Request(scope_of(headers=AUTH)), route="/capacity")
    assert verified.principal == ADA
