"""Images: global.imageRegistry rewrites every image, digests pin, pull secrets reach every Pod."""

from __future__ import annotations

import pytest
from chart_helpers import VARIANTS, Chart, container_images, pod_templates

REGISTRY = "registry.local:5000"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("variant", VARIANTS)
def test_global_image_registry_rewrites_every_image(chart: Chart, variant: str) -> None:
    docs = chart.render_variant(variant, "--set", f"global.imageRegistry={REGISTRY}")
    images = container_images(docs)
    assert images
    wrong = [i for i in images if not i.startswith(f"{REGISTRY}/")]
    assert not wrong, wrong


def test_every_kind_of_image_is_rewritten(chart: Chart) -> None:
    docs = chart.render(
        "--set", f"global.imageRegistry={REGISTRY}",
        "--set", "postgres.bundled.enabled=true",
        "--set", "postgres.bundled.auth.existingSecret=pg",
        "--set", "embedder.volume.type=image",
    )  # fmt: skip
    assert set(container_images(docs)) == {
        f"{REGISTRY}/kdbl/kdbl:0.1.0",
        f"{REGISTRY}/pgvector/pgvector:pg18",
        f"{REGISTRY}/kdbl/kdbl-model:0.1.0",
    }


def test_a_registry_host_in_the_repository_is_replaced_not_nested(chart: Chart) -> None:
    docs = chart.render(
        "--set", f"global.imageRegistry={REGISTRY}/mirror",
        "--set", "image.repository=docker.io/kdbl/kdbl",
    )  # fmt: skip
    assert set(container_images(docs)) == {f"{REGISTRY}/mirror/kdbl/kdbl:0.1.0"}


def test_default_images_use_the_app_version_tag(chart: Chart) -> None:
    assert set(container_images(chart.render())) == {"kdbl/kdbl:0.1.0"}


def test_bundled_postgres_defaults_to_pgvector_pg18(chart: Chart) -> None:
    images = container_images(chart.render_variant("bundled-postgres"))
    assert "pgvector/pgvector:pg18" in images


def test_a_digest_pins_the_image_by_digest(chart: Chart) -> None:
    images = set(container_images(chart.render("--set", f"image.digest={DIGEST}")))
    assert images == {f"kdbl/kdbl@{DIGEST}"}
    images = set(
        container_images(
            chart.render_variant("ingress-hpa-digest", "--set", f"global.imageRegistry={REGISTRY}")
        )
    )
    assert images == {f"{REGISTRY}/kdbl/kdbl@sha256:{'0123456789abcdef' * 4}"}


def test_pull_secrets_reach_every_pod(chart: Chart) -> None:
    docs = chart.render_variant("private-registry")
    for pod in pod_templates(docs):
        assert pod.spec.get("imagePullSecrets") == [{"name": "regcred"}, {"name": "klake-pull"}], pod.name
    for pod in pod_templates(chart.render()):
        assert "imagePullSecrets" not in pod.spec
