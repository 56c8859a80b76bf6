"""The chart exposes the API as the app does (issue 13 items 11, 12): /metrics on its own port that only
the monitoring namespace may reach, and X-Forwarded-For believed only from configured proxies."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import VARIANTS, Chart, env_of, one, policies_for, pod_templates, variant_args


def _api(docs: list[dict[str, Any]]):
    return next(p for p in pod_templates(docs) if p.component == "api")


def _rules_for_port(docs: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    return [rule for policy in policies_for(docs, _api(docs), "Ingress")
            for rule in policy["spec"].get("ingress") or []
            if port in {p["port"] for p in rule.get("ports") or []} or not rule.get("ports")]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_metrics_port_is_reachable_only_from_the_monitoring_namespace(chart: Chart, variant: str) -> None:
    docs = chart.render(*variant_args(variant))
    [container] = _api(docs).spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert env_of(container)["KDBL_METRICS_PORT"]["value"] == str(ports["metrics"]) == "9464"
    assert ports["metrics"] != ports["http"]
    rules = _rules_for_port(docs, ports["metrics"])
    assert [rule["from"] for rule in rules] == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]]
    for rule in _rules_for_port(docs, ports["http"]):  # the API port's rules do not open the metrics port
        assert [p["port"] for p in rule["ports"]] == [ports["http"]]
    service = one(docs, "Service", "kdbl-api")["spec"]["ports"]
    assert {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"} in service


def test_who_may_scrape_metrics_is_a_value(chart: Chart) -> None:
    peers = ('[{"namespaceSelector":{"matchLabels":{"team":"obs"}},'
             '"podSelector":{"matchLabels":{"app":"prometheus"}}}]')
    docs = chart.render("--set-json", f"api.metrics.allowFrom={peers}", "--set", "api.metrics.port=9100")
    [rule] = _rules_for_port(docs, 9100)
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"team": "obs"}},
                             "podSelector": {"matchLabels": {"app": "prometheus"}}}]
    nobody = chart.render("--set-json", "api.metrics.allowFrom=[]")
    assert _rules_for_port(nobody, 9464) == []


def test_trusted_proxies_are_a_value_and_none_by_default(chart: Chart) -> None:
    [default] = _api(chart.render()).spec["containers"]
    assert "KDBL_TRUSTED_PROXIES" not in env_of(default)
    docs = chart.render("--set-json", 'api.trustedProxies=["10.42.0.0/16","192.168.1.5"]')
    [container] = _api(docs).spec["containers"]
    assert env_of(container)["KDBL_TRUSTED_PROXIES"]["value"] == "10.42.0.0/16,192.168.1.5"


def test_a_trusted_proxy_that_is_not_an_address_is_refused_by_the_schema(chart: Chart) -> None:
    result = chart.template("--set-json", 'api.trustedProxies=["ingress-nginx"]')
    assert result.returncode != 0 and "trustedProxies" in result.stderr
