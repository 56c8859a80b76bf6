"""postgres.mode=cloudnativepg (issue 32): the chart renders a CloudNativePG Cluster (a primary and hot
standbys), points the migrations, the operator and the worker at its -rw Service and the API at -rw plus
-ro for reads (KDBL_DATABASE_READ_URL), and opens egress to its Pods. database.external.readUrl gives an
external database a read URL. Values files from before postgres.mode render as they did."""

from __future__ import annotations

import ast
import copy
from typing import Any

import pytest
from chart_helpers import (
    REPO_ROOT,
    VARIANTS,
    Chart,
    PodTemplate,
    by_kind,
    custom_resource_validator,
    env_of,
    one,
    pod_templates,
    policies_for,
    variant_args,
)

CNPG = ("--set", "postgres.mode=cloudnativepg")
CLUSTER = "kdbl-pg"
RW, RO = f"{CLUSTER}-rw", f"{CLUSTER}-ro"
OPERAND = "ghcr.io/cloudnative-pg/postgresql:18-standard-bookworm"
REGISTRY = "registry.local:5000"
DIGEST = "sha256:" + "ef" * 32
API_PW, WORKER_PW = "api-db-password", "worker-db-password"
COMPONENTS = ("api", "worker", "operator", "migrate")
SYNCHRONOUS = '{"method":"any","number":1,"dataDurability":"required"}'
READ_ENV = {"KDBL_DATABASE_READ_URL", "KDBL_READ_MAX_LAG_S", "KDBL_READ_POOL_SIZE"}
OLD_VARIANTS = [v for v in VARIANTS if v != "cloudnativepg"]


def _cluster(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (cluster,) = by_kind(docs, "Cluster")
    assert cluster["apiVersion"] == "postgresql.cnpg.io/v1"
    assert cluster["metadata"]["name"] == CLUSTER
    return cluster


def _pod(docs: list[dict[str, Any]], component: str) -> PodTemplate:
    (pod,) = [p for p in pod_templates(docs) if p.component == component]
    return pod


def _env(docs: list[dict[str, Any]], component: str) -> dict[str, dict[str, Any]]:
    pod = _pod(docs, component)
    (main,) = pod.spec["containers"]
    return env_of(main)


# --- the Cluster -----------------------------------------------------------------------------------


def test_cloudnativepg_renders_a_cluster_of_a_primary_and_two_hot_standbys(chart: Chart) -> None:
    docs = chart.render(*CNPG)
    spec = _cluster(docs)["spec"]
    assert spec["instances"] == 3
    assert spec["imageName"] == OPERAND  # CNPG's "standard" image: pgvector included
    assert spec["bootstrap"] == {"initdb": {"database": "kdbl", "owner": "kdbl"}}
    assert spec["postgresql"]["parameters"] == {
        "hot_standby_feedback": "on",
        "max_standby_streaming_delay": "5s",
    }
    assert "extensions" not in spec["postgresql"], "kdbl_bm25 needs image volumes: off by default"
    assert spec["enableSuperuserAccess"] is True and "superuserSecret" not in spec
    assert spec["storage"] == {"size": "10Gi"}
    assert "walStorage" not in spec and "affinity" not in spec and "imagePullSecrets" not in spec
    assert spec["resources"]["limits"]["memory"] == "2Gi"
    assert _cluster(docs)["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    # no bundled PostgreSQL beside it
    assert not [d for d in docs if d["metadata"]["name"] == "kdbl-postgres"]


def test_the_standby_delay_stays_below_the_api_s_lag_bound_by_default(chart: Chart) -> None:
    spec = _cluster(chart.render(*CNPG))["spec"]
    delay_s = float(spec["postgresql"]["parameters"]["max_standby_streaming_delay"].removesuffix("s"))
    lag_s = float(_env(chart.render(*CNPG), "api")["KDBL_READ_MAX_LAG_S"]["value"])
    assert delay_s < lag_s == 10


def test_cluster_values_reach_the_spec(chart: Chart) -> None:
    cluster = _cluster(chart.render(
        *CNPG,
        "--set", "postgres.cloudnativepg.instances=5",
        "--set", "postgres.cloudnativepg.storage.size=50Gi",
        "--set", "postgres.cloudnativepg.storage.storageClass=fast",
        "--set", "postgres.cloudnativepg.walStorage.size=8Gi",
        "--set", "postgres.cloudnativepg.parameters.shared_buffers=1GB",
        "--set", "postgres.cloudnativepg.parameters.max_standby_streaming_delay=3s",
        "--set", "postgres.cloudnativepg.affinity.podAntiAffinityType=required",
        "--set", "postgres.cloudnativepg.superuserSecret=pg-root",
        "--set", "postgres.cloudnativepg.keepOnUninstall=false",
        "--set-json", f"postgres.cloudnativepg.synchronous={SYNCHRONOUS}",
    ))  # fmt: skip
    spec = cluster["spec"]
    assert spec["instances"] == 5
    assert spec["storage"] == {"size": "50Gi", "storageClass": "fast"}
    assert spec["walStorage"] == {"size": "8Gi"}
    assert spec["postgresql"]["parameters"] == {
        "hot_standby_feedback": "on",
        "max_standby_streaming_delay": "3s",
        "shared_buffers": "1GB",
    }
    assert spec["affinity"] == {"podAntiAffinityType": "required"}
    assert spec["superuserSecret"] == {"name": "pg-root"}
    assert spec["postgresql"]["synchronous"] == {"method": "any", "number": 1, "dataDurability": "required"}
    assert "synchronous" not in _cluster(chart.render(*CNPG))["spec"]["postgresql"]  # asynchronous by default
    validator = custom_resource_validator("postgresql.cnpg.io/v1", "Cluster")
    assert validator is not None and not [e.message for e in validator.iter_errors(cluster)]


def test_keep_on_uninstall_is_a_value(chart: Chart) -> None:
    cluster = _cluster(chart.render(*CNPG, "--set", "postgres.cloudnativepg.keepOnUninstall=false"))
    assert "annotations" not in cluster["metadata"]


def test_the_operand_image_follows_the_registry_digest_and_pull_secrets(chart: Chart) -> None:
    spec = _cluster(chart.render(
        *CNPG,
        "--set", f"global.imageRegistry={REGISTRY}",
        "--set", f"postgres.cloudnativepg.image.digest={DIGEST}",
        "--set", "postgres.cloudnativepg.image.pullPolicy=Always",
        "--set", "global.imagePullSecrets[0]=regcred",
    ))["spec"]  # fmt: skip
    assert spec["imageName"] == f"{REGISTRY}/cloudnative-pg/postgresql@{DIGEST}"
    assert spec["imagePullPolicy"] == "Always"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_the_ci_variant_takes_every_image_from_the_private_registry(chart: Chart) -> None:
    docs = chart.render_variant("cloudnativepg")
    spec = _cluster(docs)["spec"]
    assert spec["imageName"] == f"{REGISTRY}/cloudnative-pg/postgresql:18-standard-bookworm"
    assert spec["postgresql"]["extensions"][0]["image"]["reference"] == f"{REGISTRY}/kdbl/kdbl:0.1.0"


def test_the_operand_image_needs_a_tag_or_a_digest(chart: Chart) -> None:
    result = chart.template(*CNPG, "--set", "postgres.cloudnativepg.image.tag=")
    assert result.returncode != 0 and "postgres.cloudnativepg.image needs a tag or a digest" in result.stderr


def test_kdbl_bm25_is_an_image_volume_extension_from_the_kdbl_image(chart: Chart) -> None:
    spec = _cluster(chart.render(
        *CNPG,
        "--set", "postgres.cloudnativepg.kdblExtension.enabled=true",
        "--set", f"image.digest={DIGEST}",
        "--set", "image.pullPolicy=Always",
    ))["spec"]  # fmt: skip
    (ext,) = spec["postgresql"]["extensions"]
    assert ext == {
        "name": "kdbl-bm25",
        "image": {"reference": f"kdbl/kdbl@{DIGEST}", "pullPolicy": "Always"},
        "extension_control_path": ["opt/kdbl/pgext/share"],
        "dynamic_library_path": ["opt/kdbl/pgext/lib"],
    }
    # the paths are where airgap/pgext.py puts the extension in the kdbl image
    image_path = _constant("pgext.py", "IMAGE_PATH").value
    assert ext["extension_control_path"] == [image_path.strip("/") + "/share"]
    assert ext["dynamic_library_path"] == [image_path.strip("/") + "/lib"]


def test_the_cluster_validates_against_the_vendored_cnpg_crd_schema(chart: Chart) -> None:
    validator = custom_resource_validator("postgresql.cnpg.io/v1", "Cluster")
    assert validator is not None
    for docs in (chart.render(*CNPG), chart.render_variant("cloudnativepg")):
        cluster = _cluster(docs)
        assert not [e.message for e in validator.iter_errors(cluster)]
    bad = copy.deepcopy(cluster)
    bad["spec"]["postgresql"]["extensions"][0]["mountPath"] = "/x"  # the schema is strict, not vacuous
    assert [e.message for e in validator.iter_errors(bad)]
    bad = copy.deepcopy(cluster)
    bad["spec"]["instances"] = "three"
    assert [e.message for e in validator.iter_errors(bad)]


# --- connections -----------------------------------------------------------------------------------


def test_the_api_writes_on_rw_and_reads_on_ro_as_kdbl_api(chart: Chart) -> None:
    env = _env(chart.render(*CNPG), "api")
    assert env["KDBL_DATABASE_URL"]["value"] == f"postgresql://kdbl_api@{RW}:5432/kdbl"
    assert env["KDBL_DATABASE_READ_URL"]["value"] == f"postgresql://kdbl_api@{RO}:5432/kdbl"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "kdbl-secrets", "key": API_PW}
    assert env["KDBL_READ_MAX_LAG_S"]["value"] == "10"
    assert "KDBL_READ_POOL_SIZE" not in env


def test_the_read_bound_and_pool_are_values(chart: Chart) -> None:
    env = _env(chart.render(
        *CNPG, "--set-json", "api.readReplica.maxLagSeconds=2.5", "--set", "api.readReplica.poolSize=6"
    ), "api")  # fmt: skip
    assert env["KDBL_READ_MAX_LAG_S"]["value"] == "2.5"
    assert env["KDBL_READ_POOL_SIZE"]["value"] == "6"


def test_worker_operator_and_migrations_use_only_the_primary(chart: Chart) -> None:
    docs = chart.render(*CNPG)
    superuser = {"name": f"{CLUSTER}-superuser", "key": "password"}
    expected = {
        "worker": (f"postgresql://kdbl_worker@{RW}:5432/kdbl", {"name": "kdbl-secrets", "key": WORKER_PW}),
        "operator": (f"postgresql://postgres@{RW}:5432/kdbl", superuser),
        "migrate": (f"postgresql://postgres@{RW}:5432/kdbl", superuser),
    }
    for component, (url, password) in expected.items():
        env = _env(docs, component)
        assert env["KDBL_DATABASE_URL"]["value"] == url, component
        assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == password, component
        assert not READ_ENV & set(env), component
        assert RO not in str(env), component
    migrate = _env(docs, "migrate")  # the Job still sets the runtime roles' passwords itself
    assert migrate["KDBL_API_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "api-db-password"
    assert migrate["KDBL_WORKER_DB_PASSWORD"]["valueFrom"]["secretKeyRef"]["key"] == "worker-db-password"


def test_a_superuser_secret_of_your_own_is_what_the_owner_reads(chart: Chart) -> None:
    docs = chart.render(*CNPG, "--set", "postgres.cloudnativepg.superuserSecret=pg-root")
    for component in ("operator", "migrate"):
        ref = _env(docs, component)["PGPASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "pg-root", "key": "password"}


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "postgres.cloudnativepg.readReplicas=false"),
        ("--set", "postgres.cloudnativepg.instances=1"),  # no standby: -ro would have no endpoint
    ],
    ids=["readReplicas-false", "one-instance"],
)
def test_without_read_replicas_the_api_has_no_read_url(chart: Chart, args: tuple[str, ...]) -> None:
    env = _env(chart.render(*CNPG, *args), "api")
    assert env["KDBL_DATABASE_URL"]["value"] == f"postgresql://kdbl_api@{RW}:5432/kdbl"
    assert not READ_ENV & set(env)


def test_the_migration_job_waits_for_the_primary_after_install(chart: Chart) -> None:
    docs = chart.render(*CNPG)
    job = one(docs, "Job", "kdbl-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    policy = one(docs, "NetworkPolicy", "kdbl-migrate")
    assert policy["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    (wait,) = job["spec"]["template"]["spec"]["initContainers"]
    assert wait["name"] == "wait-for-postgres"
    assert f'socket.create_connection(("{RW}", 5432), timeout=5)' in wait["command"][-1]


def test_the_chart_renders_no_secret_of_its_own_for_cloudnativepg(chart: Chart) -> None:
    assert not by_kind(chart.render(*CNPG), "Secret")
    # runtime-role passwords given as values still go into the chart's Secret (the migration reads them)
    docs = chart.render(
        *CNPG,
        "--set", "database.runtimeRoles.apiPassword=a",
        "--set", "database.runtimeRoles.workerPassword=w",
    )  # fmt: skip
    (secret,) = by_kind(docs, "Secret")
    assert set(secret["data"]) == {"api-db-password", "worker-db-password"}


# --- NetworkPolicies -------------------------------------------------------------------------------


def test_components_reach_the_cluster_pods_on_5432_and_nothing_else_on_it(chart: Chart) -> None:
    docs = chart.render(*CNPG)
    to_cluster = {
        "to": [{"podSelector": {"matchLabels": {"cnpg.io/cluster": CLUSTER}}}],
        "ports": [{"protocol": "TCP", "port": 5432}],
    }
    for component in COMPONENTS:
        rules = [r for p in policies_for(docs, _pod(docs, component), "Egress") for r in p["spec"]["egress"]]
        assert to_cluster in rules, component
        on_5432 = [r for r in rules if 5432 in {p["port"] for p in r.get("ports") or []}]
        assert on_5432 == [to_cluster], component  # no ipBlock/any-address rule on 5432
    test_rules = [r for p in policies_for(docs, _pod(docs, "test"), "Egress") for r in p["spec"]["egress"]]
    assert to_cluster not in test_rules  # the helm test Pod talks to the API only
    assert not [d for d in by_kind(docs, "NetworkPolicy") if d["metadata"]["name"] == "kdbl-postgres"]


# --- external read URL -----------------------------------------------------------------------------


def test_an_external_read_url_given_as_a_value_goes_to_the_api_only(chart: Chart) -> None:
    url = "postgresql://kdbl_api:pw@replica.example:5432/kdbl"
    docs = chart.render("--set", f"database.external.readUrl={url}", "--set", "api.readReplica.poolSize=4")
    env = _env(docs, "api")
    assert env["KDBL_DATABASE_READ_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "kdbl-chart-secrets",
        "key": "database-read-url",
    }
    assert env["KDBL_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "database-api-url"
    assert env["KDBL_READ_MAX_LAG_S"]["value"] == "10" and env["KDBL_READ_POOL_SIZE"]["value"] == "4"
    (secret,) = by_kind(docs, "Secret")
    assert set(secret["data"]) == {"database-read-url"}
    for component in ("worker", "operator", "migrate"):
        assert not READ_ENV & set(_env(docs, component)), component


def test_an_external_read_url_from_the_existing_secret(chart: Chart) -> None:
    docs = chart.render("--set", "database.external.existingSecretKeys.readUrl=database-read-url")
    env = _env(docs, "api")
    assert env["KDBL_DATABASE_READ_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "kdbl-secrets",
        "key": "database-read-url",
    }
    assert not by_kind(docs, "Secret")


@pytest.mark.parametrize("variant", OLD_VARIANTS)
def test_no_read_url_unless_one_is_configured(chart: Chart, variant: str) -> None:
    docs = chart.render_variant(variant)
    for component in ("api", "worker", "migrate"):
        assert not READ_ENV & set(_env(docs, component)), (variant, component)
    assert not by_kind(docs, "Cluster")


# --- backward compatibility and the schema ----------------------------------------------------------


@pytest.mark.parametrize("variant", OLD_VARIANTS)
def test_values_files_without_postgres_mode_render_as_the_mode_they_imply(chart: Chart, variant: str) -> None:
    """postgres.mode unset = bundled when postgres.bundled.enabled, otherwise external: naming the mode
    changes nothing in the render."""
    implied = chart.render_variant(variant)
    bundled = any(d["kind"] == "StatefulSet" and d["metadata"]["name"] == "kdbl-postgres" for d in implied)
    mode = "bundled" if bundled else "external"
    explicit = chart.template(*variant_args(variant), "--set", f"postgres.mode={mode}")
    assert explicit.returncode == 0, explicit.stderr
    assert explicit.stdout == chart.template(*variant_args(variant)).stdout


def test_mode_bundled_is_the_same_as_the_old_switch(chart: Chart) -> None:
    secret = ("--set", "postgres.bundled.auth.existingSecret=pg")
    old = chart.template("--set", "postgres.bundled.enabled=true", *secret)
    new = chart.template("--set", "postgres.mode=bundled", *secret)
    assert old.returncode == new.returncode == 0
    assert old.stdout == new.stdout


def test_a_mode_that_contradicts_the_old_switch_fails_clearly(chart: Chart) -> None:
    result = chart.template(*CNPG, "--set", "postgres.bundled.enabled=true")
    assert result.returncode != 0
    assert "postgres.bundled.enabled=true contradicts postgres.mode=cloudnativepg" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--set", "postgres.mode=cnpg"),
        ("--set", "postgres.cloudnativepg.instances=0"),
        ("--set-json", 'postgres.cloudnativepg.parameters={"max_connections":200}'),
        ("--set", "postgres.cloudnativepg.storage.size=lots"),
        ("--set", "postgres.cloudnativepg.affinity.podAntiAffinityType=always"),
        ("--set", "postgres.cloudnativepg.replicas=3"),
        ("--set", "api.readReplica.maxLagSeconds=0"),
        ("--set", "database.external.readUrl=mysql://x"),
        ("--set", "postgres.cloudnativepg.synchronous.method=any"),
    ],
    ids=["unknown-mode", "no-instances", "non-string-parameter", "bad-size", "bad-anti-affinity",
         "unknown-key", "zero-lag", "not-a-postgres-url", "synchronous-without-number"],
)  # fmt: skip
def test_the_schema_rejects_bad_cloudnativepg_values(chart: Chart, args: tuple[str, ...]) -> None:
    result = chart.template(*args)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr


def test_notes_name_the_cluster_and_ask_for_no_database_urls(chart: Chart) -> None:
    notes = chart.notes(*CNPG)
    assert "database-url" not in notes and "postgres-password" not in notes
    assert f"kubectl cnpg status {CLUSTER} -n kdbl" in notes
    assert f"kubectl -n kdbl delete cluster {CLUSTER}" in notes
    assert "database.external.cidr" not in notes


# --- airgap and docs ---------------------------------------------------------------------------------


def _constant(module: str, name: str) -> Any:
    """The expression assigned to `name` at the top of airgap/<module> (read, not imported)."""
    tree = ast.parse((REPO_ROOT / "airgap" / module).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [name]:
            return node.value
    raise AssertionError(f"airgap/{module} has no {name}")


def _external_images() -> list[str]:
    version = _constant("build_bundle.py", "CNPG_OPERATOR_VERSION").value
    table = _constant("build_bundle.py", "EXTERNAL_IMAGES")
    refs = []
    for entry in table.elts:
        ref = entry.elts[0]
        if isinstance(ref, ast.Constant):
            refs.append(ref.value)
        else:  # f"...:{CNPG_OPERATOR_VERSION}"
            refs.append("".join(v.value if isinstance(v, ast.Constant) else version for v in ref.values))
    return refs


def test_the_airgap_bundle_names_the_cnpg_operand_and_operator_images(chart: Chart) -> None:
    refs = _external_images()
    assert _cluster(chart.render(*CNPG))["spec"]["imageName"] in refs
    operator = [r for r in refs if r.startswith("ghcr.io/cloudnative-pg/cloudnative-pg:")]
    assert len(operator) == 1
    doc = (REPO_ROOT / "docs" / "operations" / "cloudnativepg.md").read_text()
    assert operator[0] in doc and OPERAND in doc
    version = operator[0].rsplit(":", 1)[1]
    assert f"cnpg-{version}.yaml" in doc


def test_there_is_a_cloudnativepg_ci_variant() -> None:
    assert "cloudnativepg" in VARIANTS
    values = REPO_ROOT / "charts" / "kdbl" / "ci" / "cloudnativepg-values.yaml"
    assert "mode: cloudnativepg" in values.read_text()
