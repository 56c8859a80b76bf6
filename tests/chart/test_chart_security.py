"""Every Pod the chart renders runs under the restricted Pod Security profile, has resources and
probes, and sits behind NetworkPolicies that restrict both its ingress and its egress."""

from __future__ import annotations

from typing import Any

import pytest
from chart_helpers import (
    VARIANTS,
    Chart,
    PodTemplate,
    by_kind,
    one,
    pod_templates,
    policies_for,
    selector_matches,
)

LONG_RUNNING = {"Deployment", "StatefulSet", "DaemonSet"}


def _pods(chart: Chart, variant: str) -> tuple[list[dict[str, Any]], list[PodTemplate]]:
    docs = chart.render_variant(variant)
    pods = pod_templates(docs)
    assert pods
    return docs, pods


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_is_restricted(chart: Chart, variant: str) -> None:
    _, pods = _pods(chart, variant)
    for pod in pods:
        psc = pod.spec.get("securityContext") or {}
        assert psc.get("runAsNonRoot") is True, pod.name
        assert psc.get("runAsUser") == 10001, pod.name
        assert (psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", pod.name
        for forbidden in ("hostNetwork", "hostPID", "hostIPC"):
            assert not pod.spec.get(forbidden), f"{pod.name}: {forbidden}"
        assert not any("hostPath" in v for v in pod.spec.get("volumes") or []), pod.name
        for c in pod.containers():
            where = f"{pod.name}/{c['name']}"
            sc = c.get("securityContext") or {}
            assert sc.get("allowPrivilegeEscalation") is False, where
            assert sc.get("readOnlyRootFilesystem") is True, where
            assert sc.get("runAsNonRoot", True) is True, where
            assert sc.get("runAsUser", 10001) == 10001, where
            assert not sc.get("privileged"), where
            assert "ALL" in (sc.get("capabilities") or {}).get("drop", []), where
            assert not (sc.get("capabilities") or {}).get("add"), where
            assert (sc.get("seccompProfile") or {"type": "RuntimeDefault"})["type"] == "RuntimeDefault", where


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_container_has_requests_limits_and_a_writable_tmp(chart: Chart, variant: str) -> None:
    _, pods = _pods(chart, variant)
    for pod in pods:
        empty_dirs = {v["name"] for v in pod.spec.get("volumes") or [] if "emptyDir" in v}
        for c in pod.containers():
            where = f"{pod.name}/{c['name']}"
            res = c.get("resources") or {}
            for section in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(res.get(section) or {}), f"{where}: resources.{section}"
            tmp = [m for m in c.get("volumeMounts") or [] if m["mountPath"] == "/tmp"]
            assert tmp and tmp[0]["name"] in empty_dirs, f"{where}: /tmp is not an emptyDir"


@pytest.mark.parametrize("variant", VARIANTS)
def test_long_running_containers_have_liveness_and_readiness_probes(chart: Chart, variant: str) -> None:
    _, pods = _pods(chart, variant)
    for pod in pods:
        if pod.owner["kind"] not in LONG_RUNNING:
            continue
        for c in pod.spec["containers"]:
            assert c.get("livenessProbe") and c.get("readinessProbe"), f"{pod.name}/{c['name']}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_the_operator_mounts_a_service_account_token(chart: Chart, variant: str) -> None:
    _, pods = _pods(chart, variant)
    for pod in pods:
        expected = pod.component == "operator"
        assert pod.spec.get("automountServiceAccountToken") is expected, pod.name


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_is_covered_by_ingress_and_egress_network_policies(chart: Chart, variant: str) -> None:
    docs, pods = _pods(chart, variant)
    for pod in pods:
        assert policies_for(docs, pod, "Ingress"), f"{pod.name}: no ingress restriction"
        egress = policies_for(docs, pod, "Egress")
        assert egress, f"{pod.name}: no egress restriction"
        rules = [r for p in egress for r in p["spec"].get("egress") or []]
        for rule in rules:
            assert rule.get("to") or rule.get("ports"), f"{pod.name}: an egress rule allows everything"
            for peer in rule.get("to") or []:
                cidr = (peer.get("ipBlock") or {}).get("cidr")
                assert not (cidr in ("0.0.0.0/0", "::/0") and not rule.get("ports")), pod.name
        dns = [r for r in rules if {p.get("port") for p in r.get("ports") or []} == {53}]
        assert dns, f"{pod.name}: no DNS egress"


@pytest.mark.parametrize("variant", VARIANTS)
def test_default_deny_selects_every_pod(chart: Chart, variant: str) -> None:
    docs, pods = _pods(chart, variant)
    deny = one(docs, "NetworkPolicy", "kdbl-default-deny")["spec"]
    assert set(deny["policyTypes"]) == {"Ingress", "Egress"}
    assert not deny.get("ingress") and not deny.get("egress")
    for pod in pods:
        assert selector_matches(deny["podSelector"], pod.labels), pod.name


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_migration_hook_brings_its_own_network_policy(chart: Chart, variant: str) -> None:
    docs, pods = _pods(chart, variant)
    job = one(docs, "Job", "kdbl-migrate")
    migrate = next(p for p in pods if p.owner is job)
    hook = job["metadata"]["annotations"]["helm.sh/hook"]
    own = [
        p
        for p in policies_for(docs, migrate, "Egress")
        if (p["metadata"].get("annotations") or {}).get("helm.sh/hook") == hook
    ]
    assert own, "the migration Job runs before the release's NetworkPolicies exist"
    weight = int(own[0]["metadata"]["annotations"]["helm.sh/hook-weight"])
    assert weight < int(job["metadata"]["annotations"]["helm.sh/hook-weight"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_worker_fetch_port_is_reachable_only_from_api_pods(chart: Chart, variant: str) -> None:
    docs, pods = _pods(chart, variant)
    worker = next(p for p in pods if p.component == "worker")
    api = next(p for p in pods if p.component == "api")
    for policy in policies_for(docs, worker, "Ingress"):
        for rule in policy["spec"].get("ingress") or []:
            assert rule.get("from"), "an ingress rule without `from` admits everyone"
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"}, peer
                assert selector_matches(peer["podSelector"], api.labels), peer
                assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "api"
            assert [p["port"] for p in rule["ports"]] == [8081]


def _egress_ports(docs: list[dict[str, Any]], pod: PodTemplate) -> set[int]:
    return {
        port["port"]
        for policy in policies_for(docs, pod, "Egress")
        for rule in policy["spec"].get("egress") or []
        for port in rule.get("ports") or []
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_components_reach_postgres_and_the_api_reaches_the_worker(chart: Chart, variant: str) -> None:
    docs, pods = _pods(chart, variant)
    for pod in pods:
        ports = _egress_ports(docs, pod)
        if pod.component in ("api", "worker", "operator", "migrate"):
            assert 5432 in ports, pod.name
        if pod.component == "api":
            assert 8081 in ports
        if pod.component == "operator":
            assert {443, 6443} <= ports
        if pod.component in ("postgres", "test"):
            assert 5432 not in ports, pod.name


def test_api_ingress_is_open_to_the_cluster_on_its_container_port_by_default(chart: Chart) -> None:
    docs = chart.render()
    rules = one(docs, "NetworkPolicy", "kdbl-api")["spec"]["ingress"]
    assert {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 8080}]} in rules


def test_worker_source_egress_comes_from_values(chart: Chart) -> None:
    docs = chart.render_variant("inline-secrets-oidc")
    egress = one(docs, "NetworkPolicy", "kdbl-worker")["spec"]["egress"]
    cidrs = {peer["ipBlock"]["cidr"] for rule in egress for peer in rule.get("to") or [] if "ipBlock" in peer}
    assert cidrs == {"10.30.0.0/16", "192.168.50.10/32"}
    default_egress = one(chart.render(), "NetworkPolicy", "kdbl-worker")["spec"]["egress"]
    assert len(default_egress) == 1 and default_egress[0]["ports"] == [{"protocol": "TCP", "port": 5432}]


def test_external_database_and_api_server_cidrs_narrow_egress(chart: Chart) -> None:
    docs = chart.render_variant("default-external-db")
    operator_egress = one(docs, "NetworkPolicy", "kdbl-operator")["spec"]["egress"]
    assert {"ipBlock": {"cidr": "10.0.0.1/32"}} in operator_egress[0]["to"]
    assert {"ipBlock": {"cidr": "10.20.0.0/24"}} in operator_egress[1]["to"]


def test_bundled_postgres_accepts_only_the_release_components(chart: Chart) -> None:
    docs = chart.render_variant("bundled-postgres")
    policy = one(docs, "NetworkPolicy", "kdbl-postgres")["spec"]
    peers = policy["ingress"][0]["from"]
    components = sorted(p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in peers)
    assert components == ["api", "migrate", "operator", "worker"]
    assert policy["egress"] == []


def test_operator_rbac_is_least_privilege(chart: Chart) -> None:
    docs = chart.render()
    role = one(docs, "ClusterRole", "kdbl-operator-kdbl")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"])): set(r["verbs"]) for r in role["rules"]}
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
        assert "delete" not in rule["verbs"] and "deletecollection" not in rule["verbs"]
    assert rules[(("kdbl.io",), ("tenants", "sources"))] == {"get", "list", "watch", "patch"}
    assert rules[(("",), ("secrets",))] == {"get", "create", "update", "patch"}
    assert rules[(("",), ("events",))] == {"create", "patch", "get"}
    assert rules[(("kopf.dev",), ("clusterkopfpeerings", "kopfpeerings"))] == {
        "get",
        "list",
        "watch",
        "patch",
    }
    assert rules[(("apiextensions.k8s.io",), ("customresourcedefinitions",))] == {"get", "list", "watch"}
    binding = one(docs, "ClusterRoleBinding", "kdbl-operator-kdbl")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kdbl-operator", "namespace": "kdbl"}]


def test_operator_disabled_renders_no_operator_objects(chart: Chart) -> None:
    docs = chart.render_variant("operator-disabled")
    assert not by_kind(docs, "ClusterRole") and not by_kind(docs, "ClusterRoleBinding")
    assert not [d for d in docs if d["metadata"]["name"] == "kdbl-operator"]
    assert not by_kind(docs, "CustomResourceDefinition")
