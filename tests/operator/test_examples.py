"""operator/examples/*.yaml validate against the CRD schemas (jsonschema, unknown fields rejected as
`kubectl apply` with strict field validation does) and make sense to the operator; their Secrets are
valid Kubernetes objects."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kdbl_operator import desired

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "operator" / "crds"
EXAMPLES = sorted((REPO / "operator" / "examples").glob("*.yaml"))


def _strict(node: Any) -> Any:
    """openAPIV3Schema → JSON Schema that rejects unknown fields (x-kubernetes-* keywords dropped)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        if node.get("type") == "object" and "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def _validators() -> dict[str, jsonschema.Draft7Validator]:
    out = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        schema = _strict(copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]))
        schema["properties"]["metadata"] = {"type": "object"}
        out[crd["spec"]["names"]["kind"]] = jsonschema.Draft7Validator(schema)
    return out


VALIDATORS = _validators()
DOCS = [(path.name, i, doc) for path in EXAMPLES for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc]


def test_there_are_examples_of_every_kind_and_protocol():
    kinds = {doc["kind"] for _, _, doc in DOCS}
    protocols = {doc["spec"]["protocol"] for _, _, doc in DOCS if doc["kind"] == "Source"}
    assert kinds == {"Tenant", "Source", "Secret"}
    assert protocols == set(desired.PROTOCOLS)


@pytest.mark.parametrize("name,index,doc", DOCS, ids=[f"{n}#{i}" for n, i, _ in DOCS])
def test_every_example_validates(name, index, doc):
    if doc["kind"] == "Secret":
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
        return
    assert doc["apiVersion"] == "kdbl.io/v1alpha1"
    VALIDATORS[doc["kind"]].validate(doc)
    if doc["kind"] == "Tenant":  # and the operator accepts it as written (what the CEL rules also check)
        desired.tenant(doc, operator_namespace="kdbl")
    else:
        want = desired.source(doc)
        if want.credentials is not None:
            secrets = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d for _, _, d in DOCS
                       if d["kind"] == "Secret"}
            secret = secrets[(want.credentials.namespace, want.credentials.name)]
            desired.check_secret(want.credentials, {**secret.get("data", {}), **secret.get("stringData", {})})


@pytest.mark.parametrize("kind,patch", [
    ("Tenant", {"spec": {"displayName": "x", "colour": "red"}}),
    ("Tenant", {"spec": {"displayName": "x", "bootstrapToken": {"scopes": ["kdbl.admin"]}}}),
    ("Tenant", {"spec": {"displayName": "x", "mcp": {"modes": ["semantic"]}}}),
    ("Tenant", {"spec": {"displayName": "x", "sourceNamespaces": ["Bad_NS"]}}),
    ("Tenant", {"spec": {}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "ftp", "connection": {}}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "http", "connection": {"url": "https://u:p@h/"}}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "s3", "connection": {"bucket": ""}}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"},
                         "name": "no spaces please"}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs"}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"}, "labels": "x"}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"}, "labels": [" "]}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"},
                         "labels": ["x" * 201]}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"},
                         "labelGlobs": {"*.md": "docs"}}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "fs", "connection": {"path": "/x"},
                         "labelGlobs": {"*.md": [""]}}}),
    ("Source", {"spec": {"tenantRef": {"name": "a"}, "protocol": "s3", "connection": {"bucket": "b"},
                         "objectTags": "yes"}}),
])
def test_invalid_resources_are_rejected_by_the_schema(kind, patch):
    body = {"apiVersion": "kdbl.io/v1alpha1", "kind": kind, "metadata": {"name": "x"}, **patch}
    with pytest.raises(jsonschema.ValidationError):
        VALIDATORS[kind].validate(body)


def test_the_crds_are_structural_schemas():
    """Every property has a type (or preserves unknown fields); additionalProperties only as the schema of
    a map's values (never beside properties, never a boolean)."""
    def walk(node: dict[str, Any], where: str) -> None:
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), where
        if "additionalProperties" in node:
            assert "properties" not in node and isinstance(node["additionalProperties"], dict), where
            walk(node["additionalProperties"], f"{where}{{}}")
        for key, child in (node.get("properties") or {}).items():
            walk(child, f"{where}.{key}")
        if "items" in node:
            walk(node["items"], f"{where}[]")

    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            walk(version["schema"]["openAPIV3Schema"], path.name)
            assert "x-kubernetes-preserve-unknown-fields" not in version["schema"]["openAPIV3Schema"]["properties"]["status"]
