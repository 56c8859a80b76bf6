"""Registry round trip: install_bundle.py pushes an OCI image archive (a tiny image built here with
umoci, the same code path as the real images) and the packaged chart into Debian's docker-registry on
loopback; pulling them back gives the same digests and bytes."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import urllib.request
from pathlib import Path

import bundlelib
import imagebuild
import pytest
from airgap_testlib import REPO, run_install, write_minimal_bundle


def _get_json(url: str) -> dict:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as resp:
        return json.load(resp)


@pytest.fixture(scope="module")
def chart_tgz(airgap_tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chart")
    subprocess.run(
        [airgap_tools["helm"], "package", str(REPO / "charts" / "kdbl"), "-d", str(out)],
        check=True,
        capture_output=True,
    )
    return out / "kdbl-0.1.0.tgz"


def tiny_image(tmp: Path, name: str) -> tuple[bundlelib.ImageEntry, Path]:
    rootfs = tmp / f"rootfs-{name.replace('/', '_')}"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc" / "kdbl-release").write_text(f"{name}\n")
    (rootfs / "models").mkdir()
    (rootfs / "models" / "model.gguf").write_bytes(b"GGUF" + os.urandom(64))
    spec = imagebuild.ImageSpec(name, "0.1.0", {"org.opencontainers.image.title": name})
    archive = tmp / spec.archive_name
    imagebuild.image_from_dirs(
        [(rootfs, "/")],
        spec,
        archive,
        "2026-01-01T00:00:00Z",
        config=[
            "--config.user",
            "10001:10001",
            "--config.cmd",
            "kdbl-api",
            "--config.env",
            "PATH=/opt/kdbl/venv/bin:/usr/bin:/bin",
        ],
    )
    digest = imagebuild.archive_digest(archive)
    return bundlelib.ImageEntry(name, "0.1.0", digest, f"images/{spec.archive_name}"), archive


@pytest.fixture(scope="module")
def loaded(
    airgap_tools: dict[str, str], registry: str, chart_tgz: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    tmp = tmp_path_factory.mktemp("roundtrip")
    images = [tiny_image(tmp, "kdbl/kdbl"), tiny_image(tmp, "kdbl/kdbl-model")]
    bundle = write_minimal_bundle(tmp / "bundle", chart_tgz=chart_tgz, images=images)
    proc = run_install(bundle, "--registry", registry, "--insecure", "--namespace", "klake")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"bundle": bundle, "images": [e for e, _ in images], "proc": proc}


def test_images_pushed_with_the_bundles_digests(
    loaded: dict, registry: str, airgap_tools: dict[str, str]
) -> None:
    catalog = _get_json(f"http://{registry}/v2/_catalog")["repositories"]
    assert {"kdbl/kdbl", "kdbl/kdbl-model", "charts/kdbl"} <= set(catalog)
    for entry in loaded["images"]:
        out = subprocess.run(
            [airgap_tools["skopeo"], "inspect", "--tls-verify=false", f"docker://{registry}/{entry.ref}"],
            check=True,
            capture_output=True,
            text=True,
        )
        info = json.loads(out.stdout)
        assert info["Digest"] == entry.digest
        assert info["Labels"]["org.opencontainers.image.title"] == entry.name
        # the same digest is what images.txt in the bundle says
    assert bundlelib.read_images_txt(loaded["bundle"]) == loaded["images"]


def test_image_pulls_back_byte_identical(
    loaded: dict, registry: str, airgap_tools: dict[str, str], tmp_path: Path
) -> None:
    entry = loaded["images"][0]
    back = tmp_path / "back.tar"
    subprocess.run(
        [
            airgap_tools["skopeo"],
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            "--preserve-digests",
            f"docker://{registry}/{entry.ref}",
            f"oci-archive:{back}",
        ],
        check=True,
        capture_output=True,
    )
    assert imagebuild.archive_digest(back) == entry.digest
    with tarfile.open(loaded["bundle"] / entry.archive) as a, tarfile.open(back) as b:
        blobs_a = {m.name for m in a.getmembers() if m.name.startswith("blobs/sha256/") and m.isfile()}
        blobs_b = {m.name for m in b.getmembers() if m.name.startswith("blobs/sha256/") and m.isfile()}
    assert blobs_a == blobs_b
    # config: non-root user, the console script as command
    config = json.loads(
        subprocess.run(
            [
                airgap_tools["skopeo"],
                "inspect",
                "--config",
                "--tls-verify=false",
                f"docker://{registry}/{entry.ref}",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    assert config["config"]["User"] == "10001:10001"
    assert config["config"]["Cmd"] == ["kdbl-api"]


def test_chart_pulls_back_identical(
    loaded: dict, registry: str, airgap_tools: dict[str, str], tmp_path: Path
) -> None:
    helm = airgap_tools["helm"]
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
    }
    show = subprocess.run(
        [helm, "show", "chart", f"oci://{registry}/charts/kdbl", "--version", "0.1.0", "--plain-http"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    assert "name: kdbl" in show.stdout and "version: 0.1.0" in show.stdout
    subprocess.run(
        [
            helm,
            "pull",
            f"oci://{registry}/charts/kdbl",
            "--version",
            "0.1.0",
            "--plain-http",
            "-d",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    pulled = tmp_path / "kdbl-0.1.0.tgz"
    assert bundlelib.sha256_file(pulled) == bundlelib.sha256_file(
        loaded["bundle"] / "charts" / "kdbl-0.1.0.tgz"
    )


def test_prints_the_helm_install_line(loaded: dict, registry: str) -> None:
    out = loaded["proc"].stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("helm install"))
    app = loaded["images"][0]
    assert f"oci://{registry}/charts/kdbl --version 0.1.0" in line
    assert f"--set global.imageRegistry={registry}" in line
    assert f"--set image.digest={app.digest}" in line
    assert "--namespace klake --create-namespace" in line
    assert "--plain-http" in line


def test_helm_install_line_renders_against_pushed_chart(
    loaded: dict, registry: str, airgap_tools: dict[str, str], tmp_path: Path
) -> None:
    """The printed line, with install -> template, renders from the registry and every kdbl image points at
    the private registry by the pushed digest."""
    import shlex

    line = next(ln for ln in loaded["proc"].stdout.splitlines() if ln.startswith("helm install"))
    args = shlex.split(line)
    assert args[:2] == ["helm", "install"]
    args = [airgap_tools["helm"], "template", *args[2:]]
    args.remove("--create-namespace")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(tmp_path / "cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "config"),
    }
    out = subprocess.run(args, check=True, capture_output=True, text=True, env=env).stdout
    app = loaded["images"][0]
    assert f'image: "{registry}/kdbl/kdbl@{app.digest}"' in out
    assert 'image: "kdbl/' not in out


def test_dry_run_pushes_nothing(
    registry: str, airgap_tools: dict[str, str], chart_tgz: Path, tmp_path: Path
) -> None:
    images = [tiny_image(tmp_path, "kdbl/dryrun-only")]
    bundle = write_minimal_bundle(tmp_path / "bundle", chart_tgz=chart_tgz, images=images)
    proc = run_install(
        bundle, "--registry", registry, "--insecure", "--dry-run", "--chart-repo", "dryrun-charts"
    )
    assert proc.returncode == 0, proc.stderr
    dry = [ln for ln in proc.stdout.splitlines() if ln.startswith("DRY-RUN ")]
    assert any(" copy " in ln and f"docker://{registry}/kdbl/dryrun-only:0.1.0" in ln for ln in dry), (
        proc.stdout
    )
    assert any(" push " in ln and f"oci://{registry}/dryrun-charts" in ln for ln in dry), proc.stdout
    catalog = _get_json(f"http://{registry}/v2/_catalog")["repositories"]
    assert "kdbl/dryrun-only" not in catalog
    assert "dryrun-charts/kdbl" not in catalog


def test_digest_mismatch_is_detected(
    registry: str, airgap_tools: dict[str, str], chart_tgz: Path, tmp_path: Path
) -> None:
    """images.txt that lies about the digest (but is itself in SHA256SUMS) fails the load."""
    entry, archive = tiny_image(tmp_path, "kdbl/liar")
    wrong = bundlelib.ImageEntry(entry.name, entry.tag, "sha256:" + "0" * 64, entry.archive)
    bundle = write_minimal_bundle(tmp_path / "bundle", chart_tgz=chart_tgz, images=[(wrong, archive)])
    proc = run_install(bundle, "--registry", registry, "--insecure", "--skip-chart")
    assert proc.returncode == 1
    assert "the bundle says sha256:" + "0" * 64 in proc.stderr
