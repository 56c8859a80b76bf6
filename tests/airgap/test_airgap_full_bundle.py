"""The whole bundle, images included: build_bundle.py --tar, install_bundle.py into a loopback registry,
pull the images back, and run the kdbl image's root filesystem as uid 10001 (chroot) against the model
image's GGUF; the kdbl_bm25 extension the manifest names is in the image at /opt/kdbl/pgext.

Marked slow_bundle (opt-in: -m slow_bundle or KDBL_SLOW_BUNDLE=1): see airgap/README.md for timings.
Needs root (debootstrap, chroot).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import bundlelib
import pytest
from airgap_testlib import AIRGAP, find_llama_wheel, run_install

pytestmark = pytest.mark.slow_bundle


@pytest.fixture(scope="module")
def full_bundle(airgap_tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if os.geteuid() != 0:
        pytest.fail("the full bundle build needs root (debootstrap, chroot)")
    out = tmp_path_factory.mktemp("full") / "bundle"
    cmd = [sys.executable, str(AIRGAP / "build_bundle.py"), "--out", str(out), "--tar"]
    llama = find_llama_wheel()
    if llama is not None:
        cmd += ["--llama-wheel", str(llama)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert proc.returncode == 0, proc.stderr[-8000:]
    return out


def test_full_bundle_contents(full_bundle: Path) -> None:
    assert bundlelib.verify_bundle(full_bundle).ok
    manifest = bundlelib.read_manifest(full_bundle)
    images = bundlelib.read_images_txt(full_bundle)
    assert [i.ref for i in images] == ["kdbl/kdbl:0.1.0", "kdbl/kdbl-model:0.1.0"]
    assert [i["digest"] for i in manifest["images"]] == [i.digest for i in images]
    for img in images:
        sbom = full_bundle / "sbom" / (Path(img.archive).name.removesuffix(".oci.tar") + ".spdx.json")
        doc = json.loads(sbom.read_text())
        assert doc["spdxVersion"].startswith("SPDX-2")
    app_sbom = json.loads((full_bundle / "sbom" / "kdbl_kdbl-0.1.0.spdx.json").read_text())
    names = {p["name"] for p in app_sbom["packages"]}
    assert {"python3.11", "libgomp1"} <= names
    assert any(n.replace("_", "-") == "kdbl-context-lake" for n in names)
    pgext = manifest["pgext"]
    assert pgext["path"] == "/opt/kdbl/pgext" and pgext["postgres"].startswith("PostgreSQL 18.")
    assert set(pgext["files"]) == {
        "lib/kdbl_bm25.so", "share/extension/kdbl_bm25.control", "share/extension/kdbl_bm25--1.1.sql",
        "share/extension/kdbl_bm25--1.0--1.1.sql",
    }
    tar = full_bundle.with_name(full_bundle.name + ".tar")
    assert tar.is_file()
    assert tar.with_name(tar.name + ".sha256").read_text().split()[0] == bundlelib.sha256_file(tar)


def test_full_bundle_round_trip_and_runs(
    full_bundle: Path, registry: str, airgap_tools: dict[str, str], tmp_path: Path
) -> None:
    tar = full_bundle.with_name(full_bundle.name + ".tar")
    proc = run_install(tar, "--registry", registry, "--insecure", "--model-volume", "image", timeout=1200)
    assert proc.returncode == 0, proc.stderr[-6000:]
    images = {i.name: i for i in bundlelib.read_images_txt(full_bundle)}
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("helm install"))
    assert f"--set image.digest={images['kdbl/kdbl'].digest}" in line
    assert f"--set embedder.volume.image.digest={images['kdbl/kdbl-model'].digest}" in line

    skopeo, umoci = airgap_tools["skopeo"], airgap_tools["umoci"]
    layout = tmp_path / "layout"
    for name in ("kdbl/kdbl", "kdbl/kdbl-model"):
        tag = name.split("/")[1]
        subprocess.run(
            [
                skopeo,
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--preserve-digests",
                f"docker://{registry}/{name}:0.1.0",
                f"oci:{layout}:{tag}",
            ],
            check=True,
        )
        subprocess.run(
            [umoci, "unpack", "--image", f"{layout}:{tag}", str(tmp_path / tag)],
            check=True,
            capture_output=True,
        )
    rootfs = tmp_path / "kdbl" / "rootfs"
    model_root = tmp_path / "kdbl-model" / "rootfs"
    lock = json.loads((AIRGAP / "model" / "model.lock.json").read_text())
    gguf = model_root / lock["outputs"]["f16"]["file"]
    assert sorted(p.name for p in model_root.iterdir()) == [gguf.name]
    assert bundlelib.sha256_file(gguf) == lock["outputs"]["f16"]["sha256"]

    # the kdbl_bm25 extension the chart's initContainer copies for the bundled PostgreSQL
    for rel, digest in bundlelib.read_manifest(full_bundle)["pgext"]["files"].items():
        path = rootfs / "opt" / "kdbl" / "pgext" / rel
        assert bundlelib.sha256_file(path) == digest, rel
        assert path.stat().st_mode & 0o777 == 0o644 and path.stat().st_uid == 0, rel

    config = json.loads((tmp_path / "kdbl" / "config.json").read_text())
    assert config["process"]["user"]["uid"] == 10001
    assert config["process"]["args"] == ["kdbl-api"]
    env = dict(e.split("=", 1) for e in config["process"]["env"])
    assert env["PATH"].startswith("/opt/kdbl/venv/bin:")

    # run the image's root filesystem as its user, with the model image's file at /models (as the chart mounts it)
    (rootfs / "models" / gguf.name).write_bytes(gguf.read_bytes())
    (rootfs / "dev" / "null").touch()  # a container runtime provides the real one
    (rootfs / "dev" / "null").chmod(0o666)
    run_env = {"PATH": env["PATH"], "HOME": "/tmp", "LANG": "C.UTF-8"}
    chroot = ["chroot", "--userspec", "10001:10001", str(rootfs)]
    out = subprocess.run(chroot + ["kdbl-control", "--help"], capture_output=True, text=True, env=run_env)
    assert out.returncode == 0 and "usage: kdbl-control" in out.stdout, out.stderr
    code = (
        "from llama_cpp import Llama; "
        f"m = Llama(model_path='/models/{gguf.name}', embedding=True, verbose=False, n_threads=2); "
        "v = m.embed('air-gapped knowledge platform'); print(len(v) if not isinstance(v[0], list) else len(v[0]))"
    )
    out = subprocess.run(
        chroot + ["python", "-c", code], capture_output=True, text=True, env=run_env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "384"
    whoami = subprocess.run(chroot + ["id", "-un"], capture_output=True, text=True, env=run_env)
    assert whoami.stdout.strip() == "kdbl"
