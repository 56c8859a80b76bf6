"""A Tenant's spec.concurrency and spec.deadlines (issue 27): mapped to the settings keys
kdbl_core.access.policy reads, refused when out of the CRD's bounds, and the CRD, the operator and the
policy agree on tools and bounds. No cluster, no database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kdbl_core.access import policy
from kdbl_operator import desired
from kdbl_operator.desired import InvalidSpec

CRD = Path(__file__).resolve().parents[2] / "operator" / "crds" / "tenants.yaml"


def _tenant(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "acme", "uid": "u-1"},
            "spec": {"displayName": "ACME", **spec}}


def _spec_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]


def test_concurrency_and_deadlines_map_to_the_keys_the_policy_reads():
    s = desired.tenant(_tenant(concurrency={"maxInFlight": 2, "queueMilliseconds": 0}, deadlines={
        "defaultMilliseconds": 5000, "tools": {"answer": 90_000, "list_files": 250}}), operator_namespace="kdbl").settings
    assert s["concurrency"] == {"max_in_flight": 2, "queue_ms": 0}
    assert s["deadlines"] == {"default_ms": 5000, "tools": {"list_files": 250, "answer": 90_000}}
    limits = policy.parse(s, default_limits=policy.Limits(max_in_flight=4, queue_ms=2000, timeout_ms=10_000)).limits
    assert (limits.max_in_flight, limits.queue_ms, limits.timeout_ms) == (2, 0, 5000)
    assert limits.deadline_ms("answer") == 90_000 and limits.deadline_ms("search_content") == 5000


def test_a_tenant_without_them_leaves_the_installation_defaults():
    s = desired.tenant(_tenant(), operator_namespace="kdbl").settings
    assert "concurrency" not in s and "deadlines" not in s
    only_tools = desired.tenant(_tenant(deadlines={"tools": {"answer": 1000}}), operator_namespace="kdbl").settings
    assert only_tools["deadlines"] == {"tools": {"answer": 1000}}
    default = policy.Limits(max_in_flight=3, queue_ms=100, timeout_ms=7000)
    assert policy.parse(only_tools, default_limits=default).limits == policy.Limits(
        max_in_flight=3, queue_ms=100, timeout_ms=7000, tool_timeouts_ms={"answer": 1000})


@pytest.mark.parametrize("spec", [
    {"concurrency": {"maxInFlight": 0}},
    {"concurrency": {"maxInFlight": 1001}},
    {"concurrency": {"queueMilliseconds": -1}},
    {"concurrency": "lots"},
    {"deadlines": {"defaultMilliseconds": 99}},
    {"deadlines": {"tools": {"rm_rf": 1000}}},
    {"deadlines": {"tools": {"answer": 3_600_001}}},
    {"deadlines": {"tools": {"answer": True}}},
])
def test_out_of_bounds_concurrency_and_deadlines_are_refused(spec):
    with pytest.raises(InvalidSpec):
        desired.tenant(_tenant(**spec), operator_namespace="kdbl")


def test_the_crd_the_operator_and_the_policy_agree_on_tools_and_bounds():
    spec = _spec_schema()
    assert tuple(spec["deadlines"]["properties"]["tools"]["properties"]) == policy.ALL_TOOLS
    for schema in spec["deadlines"]["properties"]["tools"]["properties"].values():
        assert (schema["minimum"], schema["maximum"]) == policy.DEADLINE_MS_RANGE
    deadline = spec["deadlines"]["properties"]["defaultMilliseconds"]
    assert (deadline["minimum"], deadline["maximum"]) == policy.DEADLINE_MS_RANGE == desired.DEADLINE_MS_RANGE
    share = spec["concurrency"]["properties"]
    assert (share["maxInFlight"]["minimum"], share["maxInFlight"]["maximum"]) == policy.IN_FLIGHT_RANGE
    assert (share["queueMilliseconds"]["minimum"], share["queueMilliseconds"]["maximum"]) == policy.QUEUE_MS_RANGE
    assert desired.IN_FLIGHT_RANGE == policy.IN_FLIGHT_RANGE and desired.QUEUE_MS_RANGE == policy.QUEUE_MS_RANGE


def test_stored_values_out_of_bounds_fall_back_to_the_default_instead_of_breaking_the_tenant():
    default = policy.Limits(max_in_flight=4, queue_ms=2000, timeout_ms=10_000)
    limits = policy.parse({"concurrency": {"max_in_flight": 0, "queue_ms": "soon"},
                           "deadlines": {"default_ms": 5, "tools": {"answer": -1, "rm_rf": 100}}},
                          default_limits=default).limits
    assert limits == default
