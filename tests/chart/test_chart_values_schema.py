"""values.schema.json: strict (no unknown keys anywhere), and helm refuses bad values with a schema error."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml
from chart_helpers import CHART_DIR, CI_DIR, Chart

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def _objects_in(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    found = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            found.append((path, node))
        for key, value in node.items():
            found += _objects_in(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _objects_in(value, f"{path}[{index}]")
    return found


def test_the_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_every_object_in_the_schema_is_closed() -> None:
    open_objects = [
        path
        for path, node in _objects_in(SCHEMA)
        if "properties" in node and node.get("additionalProperties") is not False
    ]
    assert not open_objects, open_objects


def _merge(base: Any, override: Any) -> Any:
    """Helm's coalescing of a values file over the defaults (maps merge, everything else replaces)."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = _merge(base.get(key), value) if key in base else value
        return merged
    return override


def test_values_yaml_and_every_ci_variant_satisfy_the_schema() -> None:
    validator = jsonschema.Draft202012Validator(SCHEMA)
    validator.validate(DEFAULTS)
    for path in CI_DIR.glob("*-values.yaml"):
        validator.validate(_merge(DEFAULTS, yaml.safe_load(path.read_text())))


def test_every_key_of_values_yaml_is_declared_in_the_schema() -> None:
    def walk(values: dict[str, Any], schema: dict[str, Any], path: str) -> None:
        if "$ref" in schema:
            schema = SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
        props = schema.get("properties")
        if props is None:
            return
        for key, value in values.items():
            assert key in props, f"{path}.{key} is not in values.schema.json"
            if isinstance(value, dict):
                walk(value, props[key], f"{path}.{key}")

    walk(DEFAULTS, SCHEMA, "")


BAD_VALUES = {
    "unknown top-level key": ["--set", "replicaCount=3"],
    "unknown nested key": ["--set", "api.service.nodePort=30080"],
    "port above 65535": ["--set", "api.service.port=70000"],
    "port zero": ["--set", "database.external.port=0"],
    "malformed digest": ["--set", "image.digest=sha256:1234"],
    "digest with the wrong algorithm": ["--set", "image.digest=md5:" + "a" * 32],
    "unknown log format": ["--set", "logging.format=xml"],
    "non-integer replicas": ["--set", "api.replicas=two"],
    "root user": ["--set", "securityContext.runAsUser=0"],
    "bad pull policy": ["--set", "image.pullPolicy=Sometimes"],
    "bad cidr": ["--set", "operator.apiServerCIDR=10.0.0.1"],
    "unknown embedder volume type": ["--set", "embedder.volume.type=hostPath"],
    "resources without limits": ["--set", "worker.resources.limits=null"],
    "non-boolean kdbl extension switch": ["--set", "postgres.bundled.kdblExtension.enabled=maybe"],
    "unknown kdbl extension key": ["--set", "postgres.bundled.kdblExtension.path=/x"],
    "egress port out of range": [
        "--set-json",
        'worker.egress=[{"cidr":"10.0.0.0/8","ports":[{"port":99999}]}]',
    ],
}


@pytest.mark.parametrize("args", BAD_VALUES.values(), ids=BAD_VALUES.keys())
def test_helm_rejects_bad_values_with_a_schema_error(chart: Chart, args: list[str]) -> None:
    result = chart.template(*args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def test_valid_overrides_pass_the_schema(chart: Chart) -> None:
    result = chart.template(
        "--set", "api.service.port=8000",
        "--set", "image.digest=sha256:" + "0" * 64,
        "--set", "logging.level=DEBUG",
        "--set-json", 'worker.egress=[{"cidr":"10.0.0.0/8","ports":[{"port":443,"protocol":"TCP"}]}]',
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
