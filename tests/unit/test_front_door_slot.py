"""kdbl_api.front_door.slot in process: a call holds its cost in its tenant's slots while the rest of the door
runs, paced by its tenant, and gives them back however it ends; a tenant with no room left is refused 429 with
the rate limiter's headers, audited. Calls that cost nothing pass by. (kdbl_api.fair_share itself is tested
in tests/unit/test_fair_share.py.)"""

from __future__ import annotations

import pytest
from front_door_doubles import Downstream, RecordingRefusals, drive, opened, principal, rpc, tool_call

from kdbl_api.fair_share import FairShare
from kdbl_api.front_door.slot import TakeSlot
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import Decision
from kdbl_core import pacing
from kdbl_core.access.policy import Limits, TenantPolicy

ADA = principal()
POLICY = TenantPolicy(limits=Limits(max_in_flight=2, queue_ms=0))
SEARCH = tool_call("search_content", {"query": "okapi"})


class Share(FairShare):
    """The real fair share, with the pacer's calls recorded."""

    def __init__(self) -> None:
        super().__init__(Observability(), pool_size=10)
        self.deferred: list = []

    async def defer(self, tenant_id) -> None:
        self.deferred.append(tenant_id)


async def test_a_call_holds_its_units_and_its_tenants_pacer_while_it_runs_and_gives_them_back():
    share, seen = Share(), []

    async def nxt(scope, receive, send):
        seen.append(share.in_flight(ADA.tenant_id))
        await pacing.checkpoint()  # a core computation's checkpoint paces with the call's tenant
        await Downstream()(scope, receive, send)

    scope, call = opened(ADA, policy=POLICY, message=SEARCH)
    assert (await drive(TakeSlot(nxt, share, RecordingRefusals()), scope)).status == 200
    assert seen == [1] and share.deferred == [ADA.tenant_id] and share.in_flight(ADA.tenant_id) == 0
    assert "queue" not in call.meta.took_ms  # it did not wait


async def test_the_slots_come_back_when_the_call_fails():
    share = Share()

    async def failing(scope, receive, send):
        raise RuntimeError("the SDK app failed")

    scope, _ = opened(ADA, policy=POLICY, message=SEARCH)
    with pytest.raises(RuntimeError):
        await drive(TakeSlot(failing, share, RecordingRefusals()), scope)
    assert share.in_flight(ADA.tenant_id) == 0


async def test_a_call_that_costs_nothing_takes_no_slot():
    share, seen = Share(), []

    async def nxt(scope, receive, send):
        seen.append(share.in_flight(ADA.tenant_id))
        await Downstream()(scope, receive, send)

    free = (rpc("tools/list"), rpc("initialize", {}), rpc("notifications/initialized", request_id=None))
    for message in free:
        scope, _ = opened(ADA, policy=POLICY, message=message)
        assert (await drive(TakeSlot(nxt, share, RecordingRefusals()), scope)).status == 200
    assert seen == [0, 0, 0]


async def test_a_tenant_without_room_is_429_with_the_rate_limiters_headers_and_audited():
    share, refusals, nxt = Share(), RecordingRefusals(), Downstream()
    held = await share.acquire(ADA.tenant_id, "acme", 2, POLICY.limits)
    decision = Decision(True, 0, 60, 30, 5, "60;w=60")
    scope, _ = opened(ADA, policy=POLICY, message=SEARCH, decision=decision)
    answer = await drive(TakeSlot(nxt, share, refusals), scope)
    assert answer.status == 429 and answer.header("retry-after") == "1"
    assert answer.header("ratelimit-remaining") == "30"
    assert answer.json()["error"]["data"]["max_in_flight"] == 2
    [row] = refusals.rows
    assert (row["tool"], row["status"], row["error"]) == ("search_content", "rate_limited",
                                                          answer.json()["error"]["message"])
    assert nxt.reached == []
    held.release()
