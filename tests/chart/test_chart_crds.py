"""CRDs: operator/crds is the single source of truth; the chart carries a byte-identical copy,
renders it only when crds.create is set, and keeps it on uninstall. Real schemas, no blanket
x-kubernetes-preserve-unknown-fields on spec."""

from __future__ import annotations

import copy
import subprocess
from typing import Any

import jsonschema
import pytest
import yaml
from chart_helpers import CHART_DIR, REPO_ROOT, Chart, by_kind

OPERATOR_CRDS = REPO_ROOT / "operator" / "crds"
CHART_CRDS = CHART_DIR / "files" / "crds"


def _load(name: str) -> dict[str, Any]:
    return yaml.safe_load((OPERATOR_CRDS / name).read_text())


def test_chart_crds_are_byte_identical_to_operator_crds() -> None:
    source = sorted(p.name for p in OPERATOR_CRDS.glob("*.yaml"))
    copies = sorted(p.name for p in CHART_CRDS.glob("*.yaml"))
    assert source == copies == ["sources.yaml", "tenants.yaml"], "run charts/sync-crds.sh"
    for name in source:
        assert (OPERATOR_CRDS / name).read_bytes() == (CHART_CRDS / name).read_bytes(), (
            f"{name} drifted: run charts/sync-crds.sh"
        )


def test_sync_script_check_mode_agrees() -> None:
    proc = subprocess.run(
        ["bash", str(REPO_ROOT / "charts" / "sync-crds.sh"), "--check"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


def test_crds_render_with_the_keep_policy_and_toggle_off(chart: Chart) -> None:
    crds = by_kind(chart.render(), "CustomResourceDefinition")
    assert sorted(c["metadata"]["name"] for c in crds) == ["sources.kdbl.io", "tenants.kdbl.io"]
    for crd in crds:
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        source = _load(crd["spec"]["names"]["plural"] + ".yaml")
        assert crd["spec"] == source["spec"], "the chart must render the CRD unchanged"
    assert not by_kind(chart.render("--set", "crds.create=false"), "CustomResourceDefinition")
    assert not (CHART_DIR / "crds").exists(), "crds/ cannot be toggled or kept; use templates/crds"


@pytest.mark.parametrize(
    "name,scope,kind,fields",
    [
        ("tenants.yaml", "Cluster", "Tenant", {"displayName", "hybrid"}),
        (
            "sources.yaml",
            "Namespaced",
            "Source",
            {
                "tenantRef",
                "protocol",
                "connection",
                "credentialsSecretRef",
                "include",
                "exclude",
                "schedule",
                "hybrid",
                "acl",
                "labels",
                "labelGlobs",
                "objectTags",
            },  # fmt: skip
        ),
    ],
)
def test_crds_have_a_real_schema_and_a_status_subresource(
    name: str, scope: str, kind: str, fields: set[str]
) -> None:
    crd = _load(name)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["spec"]["group"] == "kdbl.io" and crd["spec"]["scope"] == scope
    assert crd["spec"]["names"]["kind"] == kind
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "x-kubernetes-preserve-unknown-fields" not in spec
    assert fields <= set(spec["properties"])
    # structural schemas: additionalProperties only as a map's value schema, never beside properties
    maps = list(_maps(version["schema"]["openAPIV3Schema"]))
    assert all("properties" not in node and isinstance(node["additionalProperties"], dict) for node in maps)
    assert len(maps) == (2 if kind == "Source" else 0)  # Source.spec.labelGlobs (glob -> labels), permissionMap


def _maps(node: Any) -> Any:
    if isinstance(node, dict):
        if "additionalProperties" in node:
            yield node
        for value in node.values():
            yield from _maps(value)
    elif isinstance(node, list):
        for value in node:
            yield from _maps(value)


def _strict_jsonschema(node: Any) -> Any:
    """openAPIV3Schema -> JSON Schema that, like kubectl's strict field validation, rejects unknown fields."""
    if isinstance(node, dict):
        out = {k: _strict_jsonschema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        if (
            node.get("type") == "object"
            and "properties" in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict_jsonschema(v) for v in node]
    return node


def _validator(name: str) -> jsonschema.Draft7Validator:
    schema = _load(name)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    strict = _strict_jsonschema(copy.deepcopy(schema))
    strict["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(strict)


TENANT = {"apiVersion": "kdbl.io/v1alpha1", "kind": "Tenant", "metadata": {"name": "acme"},
          "spec": {"displayName": "ACME Corp", "hybrid": True}}  # fmt: skip
SOURCE = {
    "apiVersion": "kdbl.io/v1alpha1",
    "kind": "Source",
    "metadata": {"name": "finance", "namespace": "kdbl"},
    "spec": {
        "tenantRef": {"name": "acme"},
        "protocol": "s3",
        "connection": {"endpoint": "https://minio.kdbl:9000", "bucket": "finance", "prefix": "reports/"},
        "credentialsSecretRef": {"name": "finance-s3"},
        "include": ["**/*.pdf"],
        "exclude": ["tmp/**"],
        "schedule": "@every 30m",
        "hybrid": False,
        "acl": {"mode": "restricted", "groups": ["finance"]},
        "labels": ["finance"],
        "labelGlobs": {"reports/**/*.xlsx": ["report", "spreadsheet"]},
        "objectTags": True,
    },
}


def test_example_custom_resources_validate_against_the_crds() -> None:
    _validator("tenants.yaml").validate(TENANT)
    _validator("sources.yaml").validate(SOURCE)


@pytest.mark.parametrize(
    "patch",
    [
        {"protocol": "ftp"},
        {"tenantRef": {}},
        {"connection": {"port": 70000}},
        {"unknownField": 1},
        {"acl": {"mode": "everyone"}},
        {"labels": [""]},
        {"labels": "finance"},
        {"labelGlobs": {"*.pdf": ["x" * 201]}},
        {"labelGlobs": ["*.pdf"]},
        {"objectTags": "true"},
    ],
)
def test_invalid_sources_are_rejected(patch: dict[str, Any]) -> None:
    bad = copy.deepcopy(SOURCE)
    bad["spec"].update(patch)
    with pytest.raises(jsonschema.ValidationError):
        _validator("sources.yaml").validate(bad)


def test_a_tenant_needs_a_display_name() -> None:
    bad = copy.deepcopy(TENANT)
    del bad["spec"]["displayName"]
    with pytest.raises(jsonschema.ValidationError):
        _validator("tenants.yaml").validate(bad)
