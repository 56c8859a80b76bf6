"""The ingress exposes only /api/; NOTES.txt tells the admin what to do next."""

from __future__ import annotations

from chart_helpers import Chart, by_kind


def test_no_ingress_by_default(chart: Chart) -> None:
    assert not by_kind(chart.render(), "Ingress")


def test_the_ingress_routes_only_api_to_kdbl_api(chart: Chart) -> None:
    (ingress,) = by_kind(chart.render_variant("ingress-hpa-digest"), "Ingress")
    spec = ingress["spec"]
    assert "defaultBackend" not in spec
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["klake.example.com"], "secretName": "klake-tls"}]
    paths = [p for rule in spec["rules"] for p in rule["http"]["paths"]]
    assert [rule["host"] for rule in spec["rules"]] == ["klake.example.com"]
    assert paths == [
        {
            "path": "/api/",
            "pathType": "Prefix",
            "backend": {"service": {"name": "kdbl-api", "port": {"name": "http"}}},
        }
    ]


def test_notes_explain_secrets_tenants_tokens_and_the_mcp_endpoint(chart: Chart) -> None:
    notes = chart.notes()
    assert "kubectl -n kdbl create secret generic kdbl-secrets" in notes
    for key in ("database-url", "database-api-url", "database-worker-url", "internal-fetch-token",
                "download-signing-secret", "api-db-password", "worker-db-password"):  # fmt: skip
        assert f"--from-literal={key}=" in notes
    assert "kind: Tenant" in notes and "apiVersion: kdbl.io/v1alpha1" in notes
    assert "kubectl -n kdbl exec deploy/kdbl-operator -- kdbl-control tenant create acme" in notes
    assert "bootstrapSecretRef" in notes
    assert "http://kdbl-api.kdbl.svc.cluster.local/mcp" in notes


def test_notes_follow_the_namespace_and_service_name(chart: Chart) -> None:
    notes = chart.notes("--namespace", "search", "--set", "api.service.name=klake")
    assert "http://klake.search.svc.cluster.local/mcp" in notes
