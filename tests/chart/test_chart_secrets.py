"""No secret value in values.yaml or in a default render; missing secrets fail the render clearly."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from chart_helpers import CHART_DIR, VARIANTS, Chart, by_kind, env_of, pod_templates

SECRET_ENV = re.compile(r"(SECRET|TOKEN|PASSWORD|DATABASE_URL)")
URL_WITH_PASSWORD = re.compile(r"://[^/@:\s\"']+:[^/@\s\"']+@")


def _leaves(node: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, node)]


def test_values_yaml_holds_no_secret_value() -> None:
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for path, value in _leaves(defaults):
        leaf = path.rsplit(".", 1)[-1]
        if ".existingSecretKeys." in path:
            continue  # key names inside a Secret, not secrets
        if leaf in ("value", "password", "url", "apiUrl", "workerUrl", "apiPassword", "workerPassword"):
            assert value == "", f"{path} must be empty by default"


def test_a_default_render_contains_no_secret_values(chart: Chart) -> None:
    result = chart.template()
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert not by_kind(docs, "Secret")
    assert not URL_WITH_PASSWORD.search(result.stdout)
    for pod in pod_templates(docs):
        for c in pod.containers():
            for name, var in env_of(c).items():
                if SECRET_ENV.search(name):
                    assert "secretKeyRef" in var.get("valueFrom", {}), f"{pod.name}/{c['name']}: {name}"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "inline-secrets-oidc"])
def test_variants_without_inline_secrets_render_no_secret(chart: Chart, variant: str) -> None:
    docs = chart.render_variant(variant)
    assert not by_kind(docs, "Secret")


def test_inline_secrets_go_into_one_hook_secret(chart: Chart) -> None:
    docs = chart.render_variant("inline-secrets-oidc")
    (secret,) = by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "kdbl-chart-secrets"
    # A hook, so the migration Job (itself a pre-install hook) can read it on the first install.
    assert secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert set(secret["data"]) == {
        "database-url",
        "database-api-url",
        "database-worker-url",
        "api-db-password",
        "worker-db-password",
        "download-signing-secret",
        "internal-fetch-token",
        "oidc-jwks",
    }
    for pod in pod_templates(docs):
        for c in pod.containers():
            for var in env_of(c).values():
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] == "kdbl-chart-secrets" and ref["key"] in secret["data"]


MISSING = {
    "database URL": (["--set", "database.external.existingSecret="], "database.external (kdbl_"),
    "internal fetch token": (["--set", "internalFetchToken.existingSecret="], "internalFetchToken"),
    "download signing secret": (
        ["--set", "downloads.signingSecret.existingSecret="],
        "downloads.signingSecret",
    ),
    "runtime role passwords": (["--set", "database.runtimeRoles.existingSecret="], "database.runtimeRoles"),
    "bundled postgres password": (
        ["--set", "postgres.bundled.enabled=true"],
        "postgres.bundled.auth.existingSecret or postgres.bundled.auth.password is required",
    ),
    "oidc jwks": (
        ["--set", "oidc.enabled=true", "--set", "oidc.issuer=https://idp", "--set", "oidc.audience=kdbl"],
        "oidc.jwks",
    ),
    "ingress host": (["--set", "ingress.enabled=true"], "ingress.host is required"),
}


@pytest.mark.parametrize("args,message", MISSING.values(), ids=MISSING.keys())
def test_a_missing_secret_or_required_value_fails_with_a_clear_message(
    chart: Chart, args: list[str], message: str
) -> None:
    result = chart.template(*args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_disabling_downloads_drops_the_signing_secret(chart: Chart) -> None:
    docs = chart.render(
        "--set", "downloads.enabled=false", "--set", "downloads.signingSecret.existingSecret="
    )
    for pod in pod_templates(docs):
        for c in pod.containers():
            assert "KDBL_DOWNLOAD_SIGNING_SECRET" not in env_of(c)
