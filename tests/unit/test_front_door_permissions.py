"""kdbl_api.front_door.permissions in process: a disabled tenant, a token without the call's scope, resources
outside the tool allowlist — each 403, audited `denied` with the request's tool, in that order; a tool outside
the allowlist passes (the SDK layer refuses it as an unknown tool)."""

from __future__ import annotations

from front_door_doubles import PUBLIC, Downstream, RecordingRefusals, drive, opened, principal, rpc, tool_call

from kdbl_api.front_door.permissions import CheckPermissions
from kdbl_api.observability import Observability
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import SCOPE_READ, SCOPE_SEARCH

ADA = principal()
SEARCHER = principal(SCOPE_SEARCH)
SEARCH = tool_call("search_content", {"query": "okapi"})
READ = rpc("resources/read", {"uri": "kdbl://file/s/a.md"})


def _part() -> tuple[CheckPermissions, Downstream, RecordingRefusals, Observability]:
    obs, refusals, nxt = Observability(), RecordingRefusals(), Downstream()
    return CheckPermissions(nxt, obs, refusals), nxt, refusals, obs


async def test_a_call_its_token_and_tenant_allow_passes():
    part, nxt, refusals, _ = _part()
    scope, call = opened(SEARCHER, policy=TenantPolicy(), message=SEARCH)
    assert (await drive(part, scope)).status == 200 and nxt.call is call and refusals.rows == []


async def test_a_disabled_tenant_is_403_first_audited_and_counted_as_forbidden():
    part, nxt, refusals, obs = _part()
    scope, _ = opened(SEARCHER, policy=TenantPolicy(enabled=False), message=rpc("resources/list"))
    answer = await drive(part, scope)
    message = "tenant 'acme' is disabled: its tokens are refused until an administrator enables it"
    assert answer.status == 403 and answer.json()["error"] == {"code": -32003, "message": message,
                                                               "data": {"tenant_disabled": True}}
    assert answer.header("www-authenticate") is None  # not the scope refusal, which this call would also get
    [row] = refusals.rows
    assert (row["tool"], row["status"], row["error"]) == ("resources/list", "denied", message)
    assert obs.registry.get_sample_value("kdbl_auth_failures_total", {"reason": "forbidden"}) == 1
    assert nxt.reached == []


async def test_a_token_without_the_calls_scope_is_403_insufficient_scope_with_its_challenge():
    part, nxt, refusals, _ = _part()
    scope, _ = opened(SEARCHER, policy=TenantPolicy(), message=READ)
    answer = await drive(part, scope)
    message = f"insufficient scope: this call needs '{SCOPE_READ}'"
    assert answer.status == 403 and answer.json()["error"] == {"code": -32003, "message": message,
                                                               "data": {"required_scope": SCOPE_READ}}
    assert answer.header("www-authenticate") == (
        f'Bearer realm="kdbl", error="insufficient_scope", scope="{SCOPE_READ}", '
        f'resource_metadata="{PUBLIC}/.well-known/oauth-protected-resource/mcp"')
    [row] = refusals.rows
    assert (row["tool"], row["arguments"], row["status"], row["error"]) == (
        "resources/read", {"uri": "kdbl://file/s/a.md"}, "denied", message)
    assert nxt.reached == []


async def test_resources_are_403_for_a_tenant_whose_allowlist_lacks_get_file_text():
    part, nxt, refusals, _ = _part()
    scope, _ = opened(ADA, policy=TenantPolicy(tools=frozenset({"search_content"})), message=READ)
    answer = await drive(part, scope)
    message = "resources are not available to this tenant (get_file_text is not in its tool allowlist)"
    assert answer.status == 403 and answer.json()["error"]["message"] == message
    assert [(r["tool"], r["status"]) for r in refusals.rows] == [("resources/read", "denied")]
    assert nxt.reached == []


async def test_a_tool_outside_the_allowlist_passes_here_whatever_scope_it_would_need():
    part, nxt, refusals, _ = _part()
    scope, _ = opened(principal(SCOPE_READ), policy=TenantPolicy(tools=frozenset({"get_file_text"})),
                      message=SEARCH)
    assert (await drive(part, scope)).status == 200 and refusals.rows == [] and len(nxt.reached) == 1
