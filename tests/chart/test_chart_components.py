"""What each component runs with: commands, Services, environment (the contract's names), hooks."""

from __future__ import annotations

from typing import Any

from chart_helpers import Chart, by_kind, env_of, one, pod_templates


def _container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    obj = one(docs, kind, name)
    spec = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
    return spec["containers"][0]


def test_each_component_runs_its_console_script(chart: Chart) -> None:
    docs = chart.render()
    assert _container(docs, "Deployment", "kdbl-api")["command"] == ["kdbl-api"]
    assert _container(docs, "Deployment", "kdbl-worker")["command"] == ["kdbl-worker"]
    assert _container(docs, "Deployment", "kdbl-operator")["command"] == ["kdbl-operator"]
    assert _container(docs, "Job", "kdbl-migrate")["command"] == ["kdbl-control", "db", "migrate"]


def test_the_api_service_is_kdbl_api_on_port_80(chart: Chart) -> None:
    docs = chart.render()
    svc = one(docs, "Service", "kdbl-api")
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                                    {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}]
    api = _container(docs, "Deployment", "kdbl-api")
    assert api["ports"][0] == {"name": "http", "containerPort": 8080, "protocol": "TCP"}
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_api_service_name_is_overridable(chart: Chart) -> None:
    docs = chart.render("--set", "api.service.name=klake")
    assert one(docs, "Service", "klake")
    hosts = env_of(_container(docs, "Deployment", "kdbl-api"))["KDBL_ALLOWED_HOSTS"]["value"].split(",")
    assert "klake.kdbl.svc.cluster.local:*" in hosts


def test_api_worker_processes_per_pod_are_a_value(chart: Chart) -> None:
    assert env_of(_container(chart.render(), "Deployment", "kdbl-api"))["KDBL_API_WORKERS"]["value"] == "1"
    env = env_of(_container(chart.render("--set", "api.workers=2"), "Deployment", "kdbl-api"))
    assert env["KDBL_API_WORKERS"]["value"] == "2"
    refused = chart.template("--set", "api.workers=0")  # the values schema refuses 0
    assert refused.returncode != 0 and "workers" in refused.stderr


def test_the_worker_fetch_service_and_url(chart: Chart) -> None:
    docs = chart.render()
    svc = one(docs, "Service", "kdbl-worker-fetch")
    assert svc["spec"]["ports"][0]["port"] == 8081
    api_env = env_of(_container(docs, "Deployment", "kdbl-api"))
    assert api_env["KDBL_WORKER_FETCH_URL"]["value"] == "http://kdbl-worker-fetch:8081"
    worker = _container(docs, "Deployment", "kdbl-worker")
    assert worker["ports"][0]["containerPort"] == 8081
    assert worker["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_api_environment_follows_the_contract(chart: Chart) -> None:
    env = env_of(_container(chart.render(), "Deployment", "kdbl-api"))
    assert env["KDBL_MCP_ENABLED"]["value"] == "true"
    assert env["KDBL_LOG_FORMAT"]["value"] == "json"
    assert env["KDBL_EMBED_MODEL_PATH"]["value"] == "/models/all-minilm-l6-v2.f16.gguf"
    hosts = env["KDBL_ALLOWED_HOSTS"]["value"].split(",")
    for name in ("kdbl-api", "kdbl-api.kdbl", "kdbl-api.kdbl.svc", "kdbl-api.kdbl.svc.cluster.local"):
        # Host headers carry no port on port 80, so the bare name is needed besides the wildcard.
        assert name in hosts and f"{name}:*" in hosts
    for name in ("KDBL_DATABASE_URL", "KDBL_INTERNAL_FETCH_TOKEN", "KDBL_DOWNLOAD_SIGNING_SECRET"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "kdbl-secrets", name
    assert env["KDBL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-api-url"
    assert "KDBL_API_PUBLIC_URL" not in env and "KDBL_OIDC_ISSUER" not in env


def test_api_and_worker_share_the_internal_fetch_token_and_use_their_own_roles(chart: Chart) -> None:
    docs = chart.render()
    api = env_of(_container(docs, "Deployment", "kdbl-api"))
    worker = env_of(_container(docs, "Deployment", "kdbl-worker"))
    operator = env_of(_container(docs, "Deployment", "kdbl-operator"))
    migrate = env_of(_container(docs, "Job", "kdbl-migrate"))
    assert api["KDBL_INTERNAL_FETCH_TOKEN"] == worker["KDBL_INTERNAL_FETCH_TOKEN"]
    keys = {
        name: env["KDBL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"]
        for name, env in (("api", api), ("worker", worker), ("operator", operator), ("migrate", migrate))
    }
    assert keys == {
        "api": "database-api-url",
        "worker": "database-worker-url",
        "operator": "database-url",
        "migrate": "database-url",
    }
    assert migrate["KDBL_API_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "api-db-password"
    assert migrate["KDBL_WORKER_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "worker-db-password"


def test_bundled_postgres_connects_each_role_without_a_password_in_the_url(chart: Chart) -> None:
    docs = chart.render_variant("bundled-postgres")
    urls = {}
    for kind, name in (("Deployment", "kdbl-api"), ("Deployment", "kdbl-worker"), ("Job", "kdbl-migrate")):
        env = env_of(_container(docs, kind, name))
        urls[name] = env["KDBL_DATABASE_URL"]["value"]
        assert "secretKeyRef" in env["PGPASSWORD"]["valueFrom"]
    assert urls == {
        "kdbl-api": "postgresql://kdbl_api@kdbl-postgres:5432/kdbl",
        "kdbl-worker": "postgresql://kdbl_worker@kdbl-postgres:5432/kdbl",
        "kdbl-migrate": "postgresql://kdbl@kdbl-postgres:5432/kdbl",
    }
    sts = one(docs, "StatefulSet", "kdbl-postgres")
    pg = sts["spec"]["template"]["spec"]["containers"][0]
    assert env_of(pg)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "kdbl-postgres-auth",
        "key": "postgres-password",
    }
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "20Gi"


def test_migrations_run_as_a_hook_before_install_and_upgrade(chart: Chart) -> None:
    annotations = one(chart.render(), "Job", "kdbl-migrate")["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    # The bundled database only exists once the release's resources are created.
    bundled = one(chart.render_variant("bundled-postgres"), "Job", "kdbl-migrate")
    assert bundled["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    assert bundled["spec"]["template"]["spec"]["initContainers"][0]["name"] == "wait-for-postgres"


def test_the_embedding_model_is_mounted_read_only_in_api_and_worker(chart: Chart) -> None:
    docs = chart.render()
    for name in ("kdbl-api", "kdbl-worker"):
        spec = one(docs, "Deployment", name)["spec"]["template"]["spec"]
        mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "models")
        assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
        volume = next(v for v in spec["volumes"] if v["name"] == "models")
        assert volume["persistentVolumeClaim"] == {"claimName": "kdbl-models", "readOnly": True}
    off = chart.render_variant("operator-disabled")
    for pod in pod_templates(off):
        assert not any(v["name"] == "models" for v in pod.spec.get("volumes") or [])
        for c in pod.containers():
            assert "KDBL_EMBED_MODEL_PATH" not in env_of(c)


def test_worker_source_volumes_and_oidc_jwks_are_mounted(chart: Chart) -> None:
    docs = chart.render_variant("inline-secrets-oidc")
    worker = one(docs, "Deployment", "kdbl-worker")["spec"]["template"]["spec"]
    assert {"name": "shared-docs", "mountPath": "/sources/shared-docs", "readOnly": True} in worker[
        "containers"
    ][0]["volumeMounts"]
    assert any(v["name"] == "shared-docs" and "nfs" in v for v in worker["volumes"])
    api = one(docs, "Deployment", "kdbl-api")["spec"]["template"]["spec"]
    env = env_of(api["containers"][0])
    assert env["KDBL_OIDC_ISSUER"]["value"] == "https://idp.example/realms/klake"
    assert env["KDBL_OIDC_AUDIENCE"]["value"] == "kdbl"
    jwks_file = env["KDBL_OIDC_JWKS_FILE"]["value"]
    mount = next(m for m in api["containers"][0]["volumeMounts"] if m["name"] == "oidc-jwks")
    assert jwks_file == f"{mount['mountPath']}/jwks.json" and mount["readOnly"] is True
    volume = next(v for v in api["volumes"] if v["name"] == "oidc-jwks")
    assert volume["secret"]["items"] == [{"key": "oidc-jwks", "path": "jwks.json"}]
    assert env["KDBL_API_PUBLIC_URL"]["value"] == "https://klake.example.com"
    assert env["KDBL_ALLOWED_ORIGINS"]["value"] == "https://klake.example.com,https://chat.example.com"


def test_hpa_replaces_the_fixed_replica_count(chart: Chart) -> None:
    docs = chart.render_variant("ingress-hpa-digest")
    hpa = one(docs, "HorizontalPodAutoscaler", "kdbl-api")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert "replicas" not in one(docs, "Deployment", "kdbl-api")["spec"]
    assert not by_kind(chart.render(), "HorizontalPodAutoscaler")
    assert one(chart.render(), "PodDisruptionBudget", "kdbl-api")["spec"]["maxUnavailable"] == 1


def test_helm_test_pod_checks_healthz_and_readyz_over_the_service(chart: Chart) -> None:
    docs = chart.render()
    pod = one(docs, "Pod", "kdbl-test-api")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    c = pod["spec"]["containers"][0]
    assert c["image"] == "kdbl/kdbl:0.1.0"
    assert c["command"][:2] == ["python", "-c"]
    script = c["command"][2]
    assert "http://kdbl-api:80" in script and '"/healthz"' in script and '"/readyz"' in script
    compile(script, "helm-test", "exec")
