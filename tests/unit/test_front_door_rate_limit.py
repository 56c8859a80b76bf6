"""kdbl_api.front_door.rate_limit in process: tools/call, tools/list and resources/* take from the caller's
buckets (429 + Retry-After and RateLimit-* when empty, audited and counted); everything else takes nothing;
the decision rides on the call, and the door's `auth` time ends here."""

from __future__ import annotations

from front_door_doubles import (
    Downstream, Limiter, RecordingRefusals, drive, opened, principal, rpc, tool_call,
)

from kdbl_api.front_door.rate_limit import TakeRateLimit
from kdbl_api.observability import Observability
from kdbl_api.ratelimit import Decision
from kdbl_core.access.policy import TenantPolicy

ADA = principal()
ALLOWED = Decision(True, 0, 60, 41, 12, "60;w=60")
EMPTY = Decision(False, 7, 60, 0, 7, "60;w=60")


def _part(decision: Decision | None):
    obs, refusals, limiter, nxt = Observability(), RecordingRefusals(), Limiter(decision), Downstream()
    return TakeRateLimit(nxt, limiter, obs, refusals), nxt, limiter, refusals, obs


async def test_calls_that_do_work_take_a_token_and_carry_the_decision_on():
    for message in (tool_call("search_content", {"query": "q"}), rpc("tools/list"),
                    rpc("resources/read", {"uri": "kdbl://file/s/a"}), rpc("resources/templates/list")):
        part, nxt, limiter, refusals, _ = _part(ALLOWED)
        scope, call = opened(ADA, policy=TenantPolicy(), message=message)
        assert (await drive(part, scope)).status == 200, message
        assert limiter.taken == [ADA] and call.decision is ALLOWED and refusals.rows == []
        assert call.meta.took_ms["auth"] >= 0  # the door's own time, up to here


async def test_the_handshake_pings_and_notifications_take_nothing():
    for message in (rpc("initialize", {}), rpc("ping"), rpc("notifications/initialized", request_id=None)):
        part, nxt, limiter, _, _ = _part(EMPTY)
        scope, call = opened(ADA, policy=TenantPolicy(), message=message)
        assert (await drive(part, scope)).status == 200 and limiter.taken == [] and call.decision is None


async def test_an_empty_bucket_is_429_with_retry_after_and_ratelimit_headers_audited_and_counted():
    part, nxt, _, refusals, obs = _part(EMPTY)
    scope, call = opened(ADA, policy=TenantPolicy(), message=tool_call("search_content", {"query": "q"}))
    answer = await drive(part, scope)
    assert answer.status == 429 and answer.json()["error"]["data"]["retry_after_sec"] == 7
    assert answer.header("retry-after") == "7" and answer.header("ratelimit-remaining") == "0"
    assert answer.header("ratelimit-policy") == "60;w=60" and answer.header("ratelimit-limit") == "60"
    [row] = refusals.rows
    assert (row["tool"], row["status"], row["error"]) == ("search_content", "rate_limited",
                                                          answer.json()["error"]["message"])
    assert obs.registry.get_sample_value("kdbl_rate_limited_total") == 1
    assert nxt.reached == [] and "auth" not in call.meta.took_ms


async def test_no_tier_for_the_caller_means_no_decision_and_no_refusal():
    part, nxt, limiter, _, _ = _part(None)
    scope, call = opened(ADA, policy=TenantPolicy(), message=rpc("tools/list"))
    assert (await drive(part, scope)).status == 200 and limiter.taken == [ADA] and call.decision is None
