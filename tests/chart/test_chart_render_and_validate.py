"""The chart lints strictly, renders for every values variant, and every rendered object is valid
Kubernetes (kubernetes-validate --strict) for the oldest supported and the newest known version; custom
resources of other projects (CloudNativePG's Cluster) against their CRD's schema, vendored."""

from __future__ import annotations

import tarfile

import kubernetes_validate
import pytest
from chart_helpers import CHART_DIR, VARIANTS, Chart, custom_resource_validator, variant_args

OLDEST_SUPPORTED = "1.30"
NEWEST_KNOWN = kubernetes_validate.latest_version()


def test_there_is_a_values_variant_for_each_supported_shape() -> None:
    assert set(VARIANTS) >= {
        "default",
        "default-external-db",
        "bundled-postgres",
        "cloudnativepg",
        "ingress-hpa-digest",
        "operator-disabled",
        "private-registry",
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_strict_passes(chart: Chart, variant: str) -> None:
    result = chart.run("lint", "--strict", str(CHART_DIR), *variant_args(variant))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_template_renders_the_core_components(chart: Chart, variant: str) -> None:
    docs = chart.render_variant(variant)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Deployment", "kdbl-api") in names
    assert ("Deployment", "kdbl-worker") in names
    assert ("Service", "kdbl-api") in names
    assert ("Service", "kdbl-worker-fetch") in names
    assert ("Job", "kdbl-migrate") in names
    assert len(names) == len(docs), "two rendered objects share a kind and name"


@pytest.mark.parametrize("k8s_version", [OLDEST_SUPPORTED, NEWEST_KNOWN])
@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_objects_are_valid_kubernetes_strictly(chart: Chart, variant: str, k8s_version: str) -> None:
    errors = []
    for doc in chart.render_variant(variant):
        ident = f"{doc['kind']}/{doc['metadata']['name']}"
        validator = custom_resource_validator(doc["apiVersion"], doc["kind"])
        if validator is not None:
            for error in validator.iter_errors(doc):
                errors.append(f"{ident}: {'.'.join(str(p) for p in error.path)}: {error.message}")
            continue
        try:
            kubernetes_validate.validate(doc, k8s_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            errors.append(f"{ident}: {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{ident}: {exc.message}")
    assert not errors, "\n".join(errors)


def test_the_newest_known_kubernetes_version_is_recent() -> None:
    major, minor = (int(x) for x in NEWEST_KNOWN.split(".")[:2])
    assert (major, minor) >= (1, 35)


def test_model_image_volume_renders_valid_for_kubernetes_versions_with_image_volumes(chart: Chart) -> None:
    docs = chart.render("--set", "embedder.volume.type=image")
    api = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "kdbl-api")
    volume = next(v for v in api["spec"]["template"]["spec"]["volumes"] if v["name"] == "models")
    assert volume["image"]["reference"] == "kdbl/kdbl-model:0.1.0"
    for doc in docs:
        kubernetes_validate.validate(doc, NEWEST_KNOWN, strict=True)


def test_the_chart_requires_kubernetes_1_30(chart: Chart) -> None:
    assert chart.template("--kube-version", "1.30.0").returncode == 0
    result = chart.template("--kube-version", "1.29.0")
    assert result.returncode != 0 and "kubeVersion" in result.stderr


def test_the_packaged_chart_carries_the_crds_and_lints(chart: Chart, tmp_path) -> None:
    result = chart.run("package", str(CHART_DIR), "--destination", str(tmp_path))
    assert result.returncode == 0, result.stderr
    (archive,) = tmp_path.glob("kdbl-*.tgz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {
        "kdbl/files/crds/tenants.yaml",
        "kdbl/files/crds/sources.yaml",
        "kdbl/values.schema.json",
    } <= names
    lint = chart.run("lint", "--strict", str(archive))
    assert lint.returncode == 0, lint.stdout + lint.stderr
