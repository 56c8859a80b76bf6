"""Helpers for the Helm chart tests: running helm on charts/kdbl, and reading rendered objects.

A module with a unique name (not conftest) so test modules can import it whatever other conftest.py
files the wider test suite holds.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "kdbl"
CI_DIR = CHART_DIR / "ci"
HELM = REPO_ROOT / "tools" / "bin" / "helm"
INSTALL_SCRIPT = REPO_ROOT / ".ci" / "install-helm.sh"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"

NAMESPACE = "kdbl"
RELEASE = "kdbl"

# "default" renders with no values at all; every other variant is a file under charts/kdbl/ci/.
VARIANTS = ["default"] + sorted(p.name.removesuffix("-values.yaml") for p in CI_DIR.glob("*-values.yaml"))


def variant_args(variant: str) -> list[str]:
    return [] if variant == "default" else ["-f", str(CI_DIR / f"{variant}-values.yaml")]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class HelmResult:
    returncode: int
    stdout: str
    stderr: str


class Chart:
    """Runs helm against charts/kdbl; renders are cached per argument list."""

    def __init__(self, helm: Path) -> None:
        self.helm = helm
        self._cache: dict[tuple[str, ...], HelmResult] = {}
        self._parsed: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def run(self, *args: str) -> HelmResult:
        proc = subprocess.run(
            [str(self.helm), *args], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
        )
        return HelmResult(proc.returncode, proc.stdout, proc.stderr)

    def template(self, *args: str) -> HelmResult:
        if args not in self._cache:
            self._cache[args] = self.run("template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, *args)
        return self._cache[args]

    def notes(self, *args: str) -> str:
        """NOTES.txt as `helm install --dry-run=client` renders it (no cluster needed)."""
        result = self.run(
            "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, "--dry-run=client", *args
        )
        assert result.returncode == 0, result.stderr
        assert "NOTES:" in result.stdout
        return result.stdout.split("NOTES:", 1)[1]

    def render(self, *args: str) -> list[dict[str, Any]]:
        """Render and parse (cached: treat the result as read-only); fails the test when helm fails."""
        if args not in self._parsed:
            result = self.template(*args)
            assert result.returncode == 0, f"helm template {' '.join(args)} failed:\n{result.stderr}"
            self._parsed[args] = [doc for doc in yaml.load_all(result.stdout, Loader=_Loader) if doc]
        return self._parsed[args]

    def render_variant(self, variant: str, *extra: str) -> list[dict[str, Any]]:
        return self.render(*variant_args(variant), *extra)


# --- helpers over rendered objects ----------------------------------------------------------------

POD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "ReplicaSet"}


@dataclass
class PodTemplate:
    owner: dict[str, Any]
    labels: dict[str, str]
    spec: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}"

    @property
    def component(self) -> str:
        return self.labels.get("app.kubernetes.io/component", "")

    def containers(self) -> Iterator[dict[str, Any]]:
        yield from self.spec.get("initContainers") or []
        yield from self.spec.get("containers") or []


def pod_templates(docs: list[dict[str, Any]]) -> list[PodTemplate]:
    pods = []
    for doc in docs:
        kind = doc["kind"]
        if kind not in POD_KINDS:
            continue
        if kind == "Pod":
            meta, spec = doc["metadata"], doc["spec"]
        elif kind == "CronJob":
            tmpl = doc["spec"]["jobTemplate"]["spec"]["template"]
            meta, spec = tmpl["metadata"], tmpl["spec"]
        else:
            tmpl = doc["spec"]["template"]
            meta, spec = tmpl["metadata"], tmpl["spec"]
        pods.append(PodTemplate(doc, dict(meta.get("labels") or {}), spec))
    return pods


def selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (an empty selector matches everything)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def policies_for(docs: list[dict[str, Any]], pod: PodTemplate, policy_type: str) -> list[dict[str, Any]]:
    """NetworkPolicies selecting the pod that restrict `policy_type` (Ingress or Egress)."""
    found = []
    for doc in docs:
        if doc["kind"] != "NetworkPolicy":
            continue
        spec = doc["spec"]
        types = spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])
        if policy_type in types and selector_matches(spec["podSelector"], pod.labels):
            found.append(doc)
    return found


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env") or []}


def container_images(docs: list[dict[str, Any]]) -> list[str]:
    images = []
    for pod in pod_templates(docs):
        images += [c["image"] for c in pod.containers()]
        images += [v["image"]["reference"] for v in pod.spec.get("volumes") or [] if "image" in v]
    return images


# --- custom resources of other projects, validated offline -----------------------------------------

# (apiVersion, kind) -> the CRD's openAPIV3Schema, vendored (see the file's $comment; never downloaded)
CUSTOM_RESOURCE_SCHEMAS = {
    ("postgresql.cnpg.io/v1", "Cluster"): FIXTURES / "cnpg-cluster-v1.30.0.schema.json",
}


def _strict(node: Any) -> Any:
    """openAPIV3Schema -> JSON Schema that, like `kubectl apply` with strict field validation, rejects
    unknown fields (x-kubernetes-* keywords, CEL rules among them, are dropped: not checked offline)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
        closed = "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields")
        if node.get("type") == "object" and closed:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def custom_resource_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator | None:
    path = CUSTOM_RESOURCE_SCHEMAS.get((api_version, kind))
    if path is None:
        return None
    schema = _strict(copy.deepcopy(json.loads(path.read_text())))
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)
