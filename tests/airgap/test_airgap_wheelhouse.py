"""build_bundle.py --skip-images end to end, and the wheelhouse installing offline into a clean venv.

Cost (2 cores): ≈1 min to build the wheelhouse (pip wheel from PyPI/the pip cache; llama-cpp-python
is NOT rebuilt: the test passes a wheel already on the machine, see find_llama_wheel), ≈1 min for the
offline install into a fresh venv. Needs the package index (CI has it) and helm/syft from
.ci/install-airgap-tools.sh.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from pathlib import Path

import bundlelib
import pytest
from airgap_testlib import AIRGAP, find_llama_wheel, offline_env, run_install


@pytest.fixture(scope="module")
def bundle(airgap_tools: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse") / "bundle"
    cmd = [sys.executable, str(AIRGAP / "build_bundle.py"), "--out", str(out), "--skip-images"]
    llama = find_llama_wheel()
    if llama is not None:
        cmd += ["--llama-wheel", str(llama)]
    else:  # nothing cached: build_bundle builds the portable wheel (≈6-10 min), once per machine
        print("no llama-cpp-python wheel cached on this machine: build_bundle.py builds one", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return out


def test_bundle_layout_and_manifest(bundle: Path) -> None:
    assert bundlelib.verify_bundle(bundle).ok
    manifest = bundlelib.read_manifest(bundle)
    assert manifest["name"] == "kdbl-context-lake"
    assert manifest["chart"]["file"] == f"charts/kdbl-{manifest['chart']['version']}.tgz"
    assert (bundle / manifest["chart"]["file"]).is_file()
    lock = json.loads((AIRGAP / "model" / "model.lock.json").read_text())
    assert manifest["model"]["sha256"] == lock["outputs"]["f16"]["sha256"]
    assert bundlelib.sha256_file(bundle / manifest["model"]["file"]) == lock["outputs"]["f16"]["sha256"]
    assert manifest["images"] == [] and manifest["images_skipped"] is True
    assert len(manifest["source"]["commit"]) == 40
    assert manifest["build_date"].endswith("Z")
    wheels = sorted(p.name for p in (bundle / "wheels").iterdir())
    assert manifest["wheels"]["count"] == len(wheels)
    assert any(w.startswith("kdbl_context_lake-") for w in wheels)
    assert any(w.startswith("llama_cpp_python-") for w in wheels)
    assert all(bundlelib.wheel_fits_target(w) for w in wheels)
    # no prebuilt pgvector image: named in images.txt as external
    assert "pgvector/pgvector:pg18" in (bundle / "images.txt").read_text()


def test_wheelhouse_sbom(bundle: Path) -> None:
    sbom = json.loads((bundle / "sbom" / "wheels.spdx.json").read_text())
    assert sbom["spdxVersion"].startswith("SPDX-2")
    names = {bundlelib.normalize_dist(p["name"]) for p in sbom["packages"]}
    wheels = {
        bundlelib.normalize_dist(bundlelib.wheel_tags(p.name)[0]) for p in (bundle / "wheels").glob("*.whl")
    }
    assert wheels <= names, wheels - names


def test_wheelhouse_installs_offline_in_a_clean_venv(bundle: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = offline_env()
    proc = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--find-links",
            str(bundle / "wheels"),
            "kdbl-context-lake[operator]",  # the base install runs the API and worker; the operator's extra
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for script in ("kdbl-control", "kdbl-api", "kdbl-worker", "kdbl-operator"):
        assert (env_dir / "bin" / script).exists(), script
    help_ = subprocess.run(
        [str(env_dir / "bin" / "kdbl-control"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert help_.returncode == 0, help_.stderr
    assert "usage: kdbl-control" in help_.stdout
    imports = subprocess.run(
        [
            str(py),
            "-c",
            "import kdbl_api.main, kdbl_worker.main, kdbl_operator.main, kdbl_control.cli, llama_cpp, psycopg; "
            "from kdbl_core.search import _fragments, _scan; "  # the snippet's C parts are in the wheel
            "print('ok')",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert imports.returncode == 0 and imports.stdout.strip() == "ok", imports.stderr


def test_install_dry_run_prints_helm_line(bundle: Path) -> None:
    proc = run_install(bundle, "--registry", "registry.local:5000/mirror", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "no images" in proc.stderr  # built with --skip-images
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("helm install"))
    assert "oci://registry.local:5000/mirror/charts/kdbl --version 0.1.0" in line
    assert "--set global.imageRegistry=registry.local:5000/mirror" in line
