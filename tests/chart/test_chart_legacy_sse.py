"""The chart's legacy HTTP+SSE switch (issue 18): off by default (no env, no affinity); on, the API gets
its KDBL_LEGACY_SSE_* settings and the Service routes a client address to one Pod (a session's POSTs
must reach the process holding its stream); several processes per Pod are refused."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from chart_helpers import Chart, env_of, one, pod_templates

from kdbl_core.settings import Settings


def _api_env(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    [container] = next(p for p in pod_templates(docs) if p.component == "api").spec["containers"]
    return env_of(container)


def test_legacy_sse_is_off_by_default_without_env_or_session_affinity(chart: Chart) -> None:
    docs = chart.render()
    assert not [name for name in _api_env(docs) if name.startswith("KDBL_LEGACY_SSE")]
    spec = one(docs, "Service", "kdbl-api")["spec"]
    assert "sessionAffinity" not in spec and "sessionAffinityConfig" not in spec


def test_legacy_sse_on_sets_its_settings_and_client_ip_affinity(chart: Chart) -> None:
    docs = chart.render("--set", "api.legacySse.enabled=true", "--set", "api.legacySse.keepaliveSeconds=10",
                        "--set", "api.legacySse.maxSessionsPerToken=4", "--set", "api.legacySse.sendTimeoutSeconds=5")
    env = {name: item["value"] for name, item in _api_env(docs).items() if name.startswith("KDBL_LEGACY_SSE")}
    assert env == {"KDBL_LEGACY_SSE_ENABLED": "true", "KDBL_LEGACY_SSE_KEEPALIVE_S": "10",
                   "KDBL_LEGACY_SSE_SEND_TIMEOUT_S": "5",
                   "KDBL_LEGACY_SSE_MAX_SESSIONS": "256", "KDBL_LEGACY_SSE_MAX_SESSIONS_PER_TOKEN": "4"}
    settings = Settings(**{name.removeprefix("KDBL_").lower(): value for name, value in env.items()})
    assert settings.legacy_sse_enabled and settings.legacy_sse_keepalive_s == 10  # each name is a setting
    service = one(docs, "Service", "kdbl-api")
    kubernetes_validate.validate(service, kubernetes_validate.latest_version(), strict=True)
    spec = service["spec"]
    assert spec["sessionAffinity"] == "ClientIP"
    assert spec["sessionAffinityConfig"] == {"clientIP": {"timeoutSeconds": 10800}}


def test_legacy_sse_with_several_api_processes_per_pod_is_refused(chart: Chart) -> None:
    result = chart.template("--set", "api.legacySse.enabled=true", "--set", "api.workers=2")
    assert result.returncode != 0 and "api.legacySse.enabled needs api.workers=1" in result.stderr


def test_a_keepalive_outside_its_range_is_refused_by_the_schema(chart: Chart) -> None:
    result = chart.template("--set", "api.legacySse.keepaliveSeconds=0")
    assert result.returncode != 0 and "keepaliveSeconds" in result.stderr


def test_the_notes_name_the_sse_endpoint_only_when_it_is_on(chart: Chart) -> None:
    assert "/sse" not in chart.notes()
    notes = chart.notes("--set", "api.legacySse.enabled=true")
    assert "http://kdbl-api.kdbl.svc.cluster.local/sse" in notes and "sessionAffinity: ClientIP" in notes
