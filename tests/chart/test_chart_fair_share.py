"""The chart's fair share and call deadline (issue 27): api.fairShare and api.callTimeoutSeconds reach the API as
KDBL_TENANT_MAX_IN_FLIGHT, KDBL_TENANT_QUEUE_S and KDBL_CALL_TIMEOUT_S, with the settings' own defaults."""

from __future__ import annotations

from typing import Any

from chart_helpers import Chart, env_of, pod_templates

from kdbl_core.settings import Settings

NAMES = ("KDBL_TENANT_MAX_IN_FLIGHT", "KDBL_TENANT_QUEUE_S", "KDBL_CALL_TIMEOUT_S")


def _env(docs: list[dict[str, Any]], component: str) -> dict[str, str]:
    [container] = next(p for p in pod_templates(docs) if p.component == component).spec["containers"][:1]
    return {name: item.get("value") for name, item in env_of(container).items() if name in NAMES}


def _settings(env: dict[str, str]) -> Settings:
    return Settings(**{name.removeprefix("KDBL_").lower(): value for name, value in env.items()})


def test_the_defaults_are_the_settings_defaults(chart: Chart) -> None:
    env = _env(chart.render(), "api")
    assert set(env) == set(NAMES)
    chosen, default = _settings(env), Settings()
    assert (chosen.tenant_max_in_flight, chosen.tenant_queue_s, chosen.call_timeout_s) == (
        default.tenant_max_in_flight, default.tenant_queue_s, default.call_timeout_s)


def test_values_set_the_apis_fair_share_and_deadline_and_not_the_workers(chart: Chart) -> None:
    docs = chart.render("--set", "api.fairShare.maxInFlight=2", "--set-json", "api.fairShare.queueSeconds=0.5",
                        "--set", "api.callTimeoutSeconds=30")
    settings = _settings(_env(docs, "api"))
    assert (settings.tenant_max_in_flight, settings.tenant_queue_s, settings.call_timeout_s) == (2, 0.5, 30)
    assert _env(docs, "worker") == {}


def test_out_of_range_values_are_refused_by_the_schema(chart: Chart) -> None:
    for bad in ("api.fairShare.maxInFlight=0", "api.fairShare.queueSeconds=61", "api.callTimeoutSeconds=0"):
        result = chart.template("--set", bad)
        assert result.returncode != 0, bad
