"""Helpers for the airgap tests: small synthetic bundles and the two commands as subprocesses."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
AIRGAP = REPO / "airgap"
if str(AIRGAP) not in sys.path:
    sys.path.insert(0, str(AIRGAP))

import bundlelib


def run_install(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(AIRGAP / "install_bundle.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def offline_env() -> dict[str, str]:
    """An environment in which pip sees no index, no config file and no find-links of the machine."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "PYTHONPATH"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_NO_INDEX"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def write_minimal_bundle(
    root: Path,
    *,
    chart_tgz: Path | None = None,
    images: list[tuple[bundlelib.ImageEntry, Path]] = (),  # type: ignore[assignment]
) -> Path:
    """A bundle with the real layout and manifest but tiny content; SHA256SUMS written last."""
    root.mkdir(parents=True, exist_ok=True)
    for d in ("wheels", "model", "charts", "sbom", "images"):
        (root / d).mkdir(exist_ok=True)
    (root / "wheels" / "example-1.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    (root / "model" / "all-minilm-l6-v2.f16.gguf").write_bytes(b"GGUF" + bytes(range(256)) * 4)
    (root / "sbom" / "wheels.spdx.json").write_text(json.dumps({"spdxVersion": "SPDX-2.3", "packages": []}))
    chart_name = "kdbl-0.1.0.tgz"
    if chart_tgz is not None:
        (root / "charts" / chart_name).write_bytes(chart_tgz.read_bytes())
    else:
        (root / "charts" / chart_name).write_bytes(b"\x1f\x8b not really a chart")
    entries = []
    for entry, archive in images:
        (root / entry.archive).write_bytes(archive.read_bytes())
        entries.append(entry)
    if not any((root / "images").iterdir()):
        (root / "images").rmdir()
    bundlelib.write_images_txt(root, entries)
    bundlelib.write_manifest(
        root,
        {
            "name": "kdbl-context-lake",
            "version": "0.1.0",
            "build_date": "2026-01-01T00:00:00Z",
            "source": {"commit": "0" * 40, "dirty": False},
            "chart": {
                "name": "kdbl",
                "version": "0.1.0",
                "appVersion": "0.1.0",
                "file": f"charts/{chart_name}",
            },
            "model": {"file": "model/all-minilm-l6-v2.f16.gguf"},
            "images": [
                {"name": e.name, "tag": e.tag, "digest": e.digest, "archive": e.archive} for e in entries
            ],
            "external_images": [],
        },
    )
    bundlelib.write_sha256sums(root)
    return root


def find_llama_wheel() -> Path | None:
    """A llama-cpp-python wheel already on this machine: the bundle's portable build cache first,
    then pip's wheel cache (./dev setup builds one there). None: build_bundle builds it (slow)."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = "*"
    cache = Path(os.environ.get("KDBL_AIRGAP_CACHE") or "~/.cache/kdbl/airgap").expanduser()
    candidates = [
        p
        for p in sorted((cache / "llama").glob(f"{version}-*/llama_cpp_python-{version}-*.whl"))
        if not p.parent.name.endswith(".tmp")
    ]
    pip_cache = Path(os.environ.get("PIP_CACHE_DIR") or "~/.cache/pip").expanduser() / "wheels"
    candidates += sorted(
        pip_cache.rglob(f"llama_cpp_python-{version}-*.whl"), key=lambda p: p.stat().st_mtime
    )[::-1]
    return candidates[0] if candidates else None


def repack_installed_wheel(dist_name: str, out_dir: Path) -> Path:
    """The wheel of an installed distribution, rebuilt from the files its RECORD lists (with their
    modes, as a wheel stores them): what the bundle's wheelhouse holds, without downloading it."""
    import zipfile

    dist = importlib.metadata.distribution(dist_name)
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    assert tags, f"{dist_name}: no Tag in its WHEEL file"
    python, abi, platform = (".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))
    name = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-{python}-{abi}-{platform}.whl"
    out = out_dir / name
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for file in dist.files or []:
            path = Path(dist.locate_file(file))
            if not path.is_file() or "__pycache__" in file.parts:
                continue
            info = zipfile.ZipInfo(file.as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0xFFFF) << 16
            zf.writestr(info, path.read_bytes())
    return out
