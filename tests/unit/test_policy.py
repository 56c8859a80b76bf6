"""kdbl_core.access.policy: stored tenant settings -> the effective policy every reader applies."""

from __future__ import annotations

import pytest

from kdbl_core.access import policy
from kdbl_core.errors import InvalidArgument


def test_empty_settings_mean_everything_allowed_with_the_installation_default_rate():
    p = policy.parse({}, default_per_minute=600, default_burst=60)
    assert p.enabled and p.tools == frozenset(policy.TOOLS) and p.modes == {"lexical", "hybrid"}
    assert p.token_tiers == (policy.Tier(600, 60, 60),) and p.tenant_tiers == ()
    assert (p.downloads, p.link_ttl_s, dict(p.quotas)) == ("attachment", 900, {})


def test_the_operators_older_fields_keep_their_meaning():
    p = policy.parse({"enabled": False, "rate_limit": {"per_minute": 120}, "downloads": {"enabled": False},
                      "quotas": {"max_files": 10}}, default_per_minute=600, default_burst=60)
    assert not p.enabled and p.token_tiers == (policy.Tier(120, 60, 120),)
    assert p.downloads == "off" and p.quotas == {"max_files": 10}


def test_bad_stored_values_never_break_a_tenant():
    p = policy.parse({"mcp": {"tools": ["rm_rf", "list_files"], "modes": "hybrid"}, "rate_limit": {"per_minute": "x"},
                      "downloads": {"mode": 3, "link_ttl_seconds": -5}, "quotas": {"max_bytes": True}})
    assert p.tools == {"list_files"} and p.modes == {"lexical", "hybrid"}
    assert p.downloads == "attachment" and p.link_ttl_s == 900 and p.quotas == {}


def test_a_zero_minute_rate_means_no_per_token_limit_not_the_default():
    assert policy.parse({"rate_limit": {"per_minute": 0}}, default_per_minute=600).token_tiers == ()


@pytest.mark.parametrize("text,expected", [
    ("60/m", {"per_minute": 60}), ("60/m, 1000/h,5000/day", {"per_minute": 60, "per_hour": 1000, "per_day": 5000}),
    ("off", {}), ("0", {}),
])
def test_rate_limit_strings_parse_into_tiers(text, expected):
    assert policy.parse_rate(text) == expected


@pytest.mark.parametrize("text", ["60", "60/s", "60/m,1/m", "x/h", "60/fortnight"])
def test_bad_rate_limit_strings_name_the_field(text):
    with pytest.raises(InvalidArgument) as err:
        policy.parse_rate(text)
    assert err.value.field == "rate-limit"


def test_updates_change_only_the_named_fields():
    old = {"enabled": True, "mcp": {"tools": ["list_files"], "modes": ["lexical"]}, "operator": {"owner": {}},
           "rate_limit": {"per_minute": 5, "tenant": {"per_hour": 100}}}
    new = policy.apply_update(old, enabled=False, rate={"per_hour": 50}, downloads="inline")
    assert new["enabled"] is False and new["mcp"] == old["mcp"] and new["operator"] == {"owner": {}}
    assert new["rate_limit"] == {"per_hour": 50, "tenant": {"per_hour": 100}}
    assert new["downloads"] == {"mode": "inline", "enabled": True}
    assert old["rate_limit"] == {"per_minute": 5, "tenant": {"per_hour": 100}}  # not mutated
