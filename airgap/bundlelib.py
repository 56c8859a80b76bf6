"""Shared helpers of the airgap bundle tooling (build_bundle.py, install_bundle.py and the tests).

Standard library only: install_bundle.py must run on the disconnected side with any Python >= 3.11
and nothing installed.

Bundle layout (every path relative to the bundle root):

    MANIFEST.json        what was built, from which commit, with which tools
    SHA256SUMS           ``<sha256>  <path>`` for every other file (``sha256sum -c SHA256SUMS`` works)
    images.txt           ``<name>:<tag>  <manifest digest>  images/<archive>`` one image a line
    wheels/              the wheelhouse: pip install --no-index --find-links wheels kdbl-context-lake
    images/              OCI archives (skopeo: oci-archive:images/<file>)
    model/               the GGUF embedding model
    charts/              kdbl-<version>.tgz (helm package)
    sbom/                SPDX JSON SBOMs (syft)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

BUNDLE_FORMAT = 1
SUMS_NAME = "SHA256SUMS"
MANIFEST_NAME = "MANIFEST.json"
IMAGES_NAME = "images.txt"
PROJECT_DIST = "kdbl-context-lake"
REPO_ROOT = Path(__file__).resolve().parents[1]

_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


class BundleError(Exception):
    """The bundle is incomplete, tampered with, or a build/load step failed."""


# --------------------------------------------------------------------------- small helpers


def log(msg: str) -> None:
    print(f"[airgap] {msg}", file=sys.stderr, flush=True)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    capture: bool = False,
    check: bool = True,
    quiet: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise BundleError with its output (captured runs) or exit code."""
    args = [str(c) for c in cmd]
    if not quiet:
        log("$ " + shlex.join(args))
    proc = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if check and proc.returncode != 0:
        detail = ""
        if capture:
            detail = "\n" + (proc.stdout or "")[-4000:] + (proc.stderr or "")[-4000:]
        raise BundleError(f"command failed (exit {proc.returncode}): {shlex.join(args)}{detail}")
    return proc


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_cache() -> Path:
    """The build cache: $KDBL_AIRGAP_CACHE, default ~/.cache/kdbl/airgap (llama wheel, sdists, base, images)."""
    return Path(os.environ.get("KDBL_AIRGAP_CACHE") or "~/.cache/kdbl/airgap").expanduser()


def clean_pip_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def tree_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.is_symlink())


# --------------------------------------------------------------------------- SHA256SUMS


def bundle_files(root: Path) -> list[str]:
    """Every regular file under root (POSIX relative paths, sorted), SHA256SUMS excluded.

    Symlinks and other non-regular entries are reported as errors: a bundle holds plain files only.
    """
    files: list[str] = []
    odd: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                odd.append(rel)
            elif name in filenames:
                if p.is_file():
                    if rel != SUMS_NAME:
                        files.append(rel)
                else:
                    odd.append(rel)
    if odd:
        raise BundleError("the bundle may hold only plain files and directories; found: " + ", ".join(odd))
    return sorted(files)


def write_sha256sums(root: Path) -> Path:
    lines = [f"{sha256_file(root / rel)}  {rel}\n" for rel in bundle_files(root)]
    out = root / SUMS_NAME
    out.write_text("".join(lines), encoding="utf-8")
    return out


def _safe_rel(rel: str) -> bool:
    p = PurePosixPath(rel)
    return (
        bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel and p.as_posix() == rel
    )


def read_sha256sums(root: Path) -> dict[str, str]:
    path = root / SUMS_NAME
    if not path.is_file():
        raise BundleError(f"{path}: missing; this is not a complete bundle")
    sums: dict[str, str] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        m = _SUM_LINE.match(line)
        if not m:
            raise BundleError(f"{SUMS_NAME}:{n}: malformed line: {line!r}")
        digest, rel = m.group(1), m.group(2)
        if not _safe_rel(rel):
            raise BundleError(f"{SUMS_NAME}:{n}: unsafe path {rel!r}")
        if rel in sums:
            raise BundleError(f"{SUMS_NAME}:{n}: {rel} listed twice")
        sums[rel] = digest
    if not sums:
        raise BundleError(f"{SUMS_NAME} lists no file")
    return sums


@dataclass
class VerifyReport:
    checked: int
    missing: list[str]
    extra: list[str]
    mismatched: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.mismatched)

    def describe(self) -> str:
        parts = []
        for label, items in (("MISMATCH", self.mismatched), ("MISSING", self.missing), ("EXTRA", self.extra)):
            parts += [f"  {label}: {item}" for item in items]
        return "\n".join(parts)


def verify_bundle(root: Path) -> VerifyReport:
    """Check every file against SHA256SUMS; report missing, extra (unlisted) and mismatched files."""
    sums = read_sha256sums(root)
    present = set(bundle_files(root))
    missing = sorted(set(sums) - present)
    extra = sorted(present - set(sums))
    mismatched = [rel for rel in sorted(set(sums) & present) if sha256_file(root / rel) != sums[rel]]
    return VerifyReport(len(sums), missing, extra, mismatched)


def require_verified(root: Path) -> VerifyReport:
    report = verify_bundle(root)
    if not report.ok:
        raise BundleError(
            f"bundle {root} FAILED verification against {SUMS_NAME} "
            f"({len(report.mismatched)} mismatched, {len(report.missing)} missing, {len(report.extra)} extra):\n"
            + report.describe()
        )
    return report


# --------------------------------------------------------------------------- images.txt


@dataclass(frozen=True)
class ImageEntry:
    name: str  # repository path without registry, e.g. kdbl/kdbl
    tag: str
    digest: str  # sha256:... of the manifest
    archive: str  # bundle-relative path of the oci-archive

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.tag}"


def write_images_txt(root: Path, images: Iterable[ImageEntry], comments: Iterable[str] = ()) -> Path:
    lines = [
        "# K-Lake airgap bundle images: <name>:<tag>  <manifest digest>  <oci archive in this bundle>\n",
        "# Push with: python airgap/install_bundle.py <bundle> --registry REGISTRY\n",
    ]
    lines += [f"# {c}\n" for c in comments]
    for img in images:
        lines.append(f"{img.ref}  {img.digest}  {img.archive}\n")
    out = root / IMAGES_NAME
    out.write_text("".join(lines), encoding="utf-8")
    return out


def read_images_txt(root: Path) -> list[ImageEntry]:
    path = root / IMAGES_NAME
    if not path.is_file():
        return []
    entries: list[ImageEntry] = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if len(fields) != 3:
            raise BundleError(f"{IMAGES_NAME}:{n}: expected '<name>:<tag> <digest> <archive>': {line!r}")
        ref, digest, archive = fields
        name, _, tag = ref.rpartition(":")
        if not name or not tag or "/" in tag:
            raise BundleError(f"{IMAGES_NAME}:{n}: image reference needs a tag: {ref!r}")
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
            raise BundleError(f"{IMAGES_NAME}:{n}: bad digest {digest!r}")
        if not _safe_rel(archive):
            raise BundleError(f"{IMAGES_NAME}:{n}: unsafe archive path {archive!r}")
        entries.append(ImageEntry(name, tag, digest, archive))
    return entries


# --------------------------------------------------------------------------- manifest


def read_manifest(root: Path) -> dict:
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise BundleError(f"{path}: missing")
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("format") != BUNDLE_FORMAT:
        raise BundleError(
            f"{MANIFEST_NAME}: unsupported bundle format {data.get('format')!r} (want {BUNDLE_FORMAT})"
        )
    return data


def write_manifest(root: Path, data: dict) -> Path:
    out = root / MANIFEST_NAME
    out.write_text(
        json.dumps({"format": BUNDLE_FORMAT, **data}, indent=2, sort_keys=False) + "\n", encoding="utf-8"
    )
    return out


# --------------------------------------------------------------------------- wheel tags

# Debian bookworm ships glibc 2.36 and CPython 3.11: the image and the documented target.
TARGET_GLIBC = (2, 36)
TARGET_PY = (3, 11)
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def wheel_tags(filename: str) -> tuple[str, str, str, str, str]:
    """(distribution, version, python tag, abi tag, platform tag) of a wheel file name."""
    if not filename.endswith(".whl"):
        raise BundleError(f"not a wheel: {filename}")
    parts = filename[:-4].split("-")
    if len(parts) == 6:  # build tag
        parts = parts[:2] + parts[3:]
    if len(parts) != 5:
        raise BundleError(f"malformed wheel name: {filename}")
    return parts[0], parts[1], parts[2], parts[3], parts[4]


def _python_ok(py: str, abi: str) -> bool:
    major, minor = TARGET_PY
    for tag in py.split("."):
        if tag in ("py3", f"py{major}{minor}", f"cp{major}{minor}"):
            if abi in ("none", f"cp{major}{minor}", "abi3"):
                return True
        m = re.fullmatch(r"cp3(\d+)", tag)
        if m and abi == "abi3" and int(m.group(1)) <= minor:
            return True
        if tag.startswith("py3") and tag[3:].isdigit() and abi == "none" and int(tag[3:]) <= minor:
            return True
    return False


def _platform_ok(plat: str) -> bool:
    for tag in plat.split("."):
        if tag in ("any", "linux_x86_64"):
            return True
        if tag.endswith("_x86_64"):
            base = tag[: -len("_x86_64")]
            if base in _LEGACY_MANYLINUX:
                return _LEGACY_MANYLINUX[base] <= TARGET_GLIBC
            m = re.fullmatch(r"manylinux_(\d+)_(\d+)", base)
            if m and (int(m.group(1)), int(m.group(2))) <= TARGET_GLIBC:
                return True
    return False


def wheel_fits_target(filename: str) -> bool:
    """True when the wheel installs on CPython 3.11, linux x86_64, glibc 2.36 (Debian bookworm)."""
    _, _, py, abi, plat = wheel_tags(filename)
    return _python_ok(py, abi) and _platform_ok(plat)


def normalize_dist(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
