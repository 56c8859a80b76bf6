"""kdbl_api.front_door.tenant_policy in process: the caller's tenant's policy on the call, looked up before
the body is read; it refuses nothing itself (front_door.permissions does, once the message is parsed)."""

from __future__ import annotations

import pytest
from front_door_doubles import Downstream, Policies, drive, opened, principal

from kdbl_api.front_door.tenant_policy import LookUpPolicy
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.errors import Unavailable

ADA = principal()


async def test_the_callers_tenants_policy_goes_on_the_call():
    strict = TenantPolicy(tools=frozenset({"search_content"}))
    policies, nxt = Policies({ADA.tenant_id: strict}), Downstream()
    scope, call = opened(ADA)
    answer = await drive(LookUpPolicy(nxt, policies), scope, b'{"jsonrpc": "2.0"}')
    assert answer.status == 200 and policies.asked == [ADA.tenant_id]
    assert nxt.call is call and call.policy is strict
    assert nxt.bodies == [b'{"jsonrpc": "2.0"}']  # the body is still unread


async def test_a_disabled_tenant_passes_here_to_be_refused_after_its_message_is_parsed():
    policies, nxt = Policies({ADA.tenant_id: TenantPolicy(enabled=False)}), Downstream()
    scope, call = opened(ADA)
    assert (await drive(LookUpPolicy(nxt, policies), scope)).status == 200
    assert nxt.call.policy.enabled is False


async def test_a_lookup_that_fails_is_not_swallowed_the_app_answers_503():
    class Down(Policies):
        async def get(self, tenant_id):
            raise Unavailable("database unreachable", retry_after_sec=2)

    nxt = Downstream()
    scope, _ = opened(ADA)
    with pytest.raises(Unavailable):
        await drive(LookUpPolicy(nxt, Down()), scope)
    assert nxt.reached == []
