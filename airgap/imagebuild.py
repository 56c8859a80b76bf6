"""Build K-Lake's OCI images without a Docker daemon: debootstrap + umoci + skopeo.

Two images:

* ``kdbl/kdbl:<version>`` — Debian bookworm (minbase, debootstrap) with Debian's python3.11, the
  project installed from the bundle's wheelhouse into ``/opt/kdbl/venv`` (on PATH, so the console
  scripts kdbl-api, kdbl-worker, kdbl-operator and kdbl-control are plain commands), the compiled
  kdbl_bm25 PostgreSQL extension in ``/opt/kdbl/pgext`` (airgap/pgext.py; the chart copies it into the
  bundled PostgreSQL's Pod), user ``kdbl`` uid/gid 10001, default command ``kdbl-api``. Two layers: the
  Debian base and /opt/kdbl.
* ``kdbl/kdbl-model:<version>`` — one layer holding only the GGUF model at its root, for the chart's
  ``embedder.volume.type=image`` (a Kubernetes image volume mounted at /models).

Caching (under ``<cache>/images``):

* the debootstrapped base root filesystem, keyed by suite, mirror, package list and recipe version;
* each finished OCI archive, keyed by everything that goes into it (base key, wheel hashes, the
  compiled extension's files' hashes, model hash, labels other than the creation date). An unchanged
  input set costs nothing on the next build.

Needs root (debootstrap, chroot, ownership in layers) and the Debian packages debootstrap, umoci and
skopeo (.ci/install-airgap-tools.sh installs them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bundlelib import BundleError, log, run, sha256_file, sha256_text

# Bump when the recipe changes in a way the cache keys cannot see.
BASE_RECIPE = "1"
APP_RECIPE = "2"  # 2: /opt/kdbl/pgext (kdbl_bm25)
MODEL_RECIPE = "1"

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# Runtime packages on top of minbase: the interpreter, OpenMP for llama.cpp, CA certificates (TLS to
# sources), tzdata. No python3.11-venv/pip: the venv is made --without-pip and filled by a pip wheel
# run from /tmp, so the image carries no pip or setuptools.
BASE_PACKAGES = ("python3.11", "libgomp1", "ca-certificates", "tzdata")
UID = GID = 10001
USER = "kdbl"
VENV = "/opt/kdbl/venv"
PATH_ENV = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Dropped from the base layer: package caches, indexes, docs (the copyright files stay), locales.
_BASE_CLEAN = (
    "var/cache/apt/archives/*.deb",
    "var/cache/apt/*.bin",
    "var/lib/apt/lists/*",
    "var/log/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/locale/*",
    "usr/share/doc/*/changelog*",
    "usr/share/doc/*/NEWS*",
    "usr/share/doc/*/README*",
    "usr/share/doc/*/*.gz",
    "usr/share/doc/*/examples",
)


@dataclass
class ImageSpec:
    name: str  # kdbl/kdbl
    tag: str
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def archive_name(self) -> str:
        return f"{self.name.replace('/', '_')}-{self.tag}.oci.tar"


def _chroot_env() -> dict[str, str]:
    return {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "DEBIAN_FRONTEND": "noninteractive",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PYTHONDONTWRITEBYTECODE": "",
    }


def _glob_rm(root: Path, patterns: Iterable[str]) -> None:
    for pattern in patterns:
        for p in root.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)


def require_root() -> None:
    if os.geteuid() != 0:
        raise BundleError(
            "building images needs root (debootstrap, chroot); run as root or use --skip-images"
        )


def tool_version(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except OSError:
        return "missing"
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "?"


# --------------------------------------------------------------------------- base root filesystem


def base_key(mirror: str) -> str:
    return sha256_text(json.dumps([BASE_RECIPE, SUITE, mirror, BASE_PACKAGES, UID, GID]))[:16]


def base_tar_path(cache: Path, mirror: str) -> Path:
    return cache / f"base-{SUITE}-{base_key(mirror)}.tar"


def build_base_rootfs(cache: Path, mirror: str) -> Path:
    """Debootstrap (once) a minimal bookworm with python3.11 and the kdbl user; return the cached tar.
    It is reused until --refresh-base (Debian security updates) or a recipe change."""
    out = base_tar_path(cache, mirror)
    if out.is_file():
        log(f"image base: cached {out.name}")
        return out
    require_root()
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kdbl-base-", dir=cache))
    root = work / "rootfs"
    debs = cache / "debs"  # downloaded .debs, reused by later runs
    debs.mkdir(exist_ok=True)
    try:
        try:
            run(
                [
                    "debootstrap",
                    "--variant=minbase",
                    f"--cache-dir={debs}",
                    "--include=" + ",".join(BASE_PACKAGES),
                    SUITE,
                    root,
                    mirror,
                ]
            )
        except BundleError:
            dlog = root / "debootstrap" / "debootstrap.log"
            if dlog.is_file():
                shutil.copy2(dlog, cache / "debootstrap-failed.log")
                log(f"debootstrap failed; its log: {cache / 'debootstrap-failed.log'}")
            raise
        env = _chroot_env()
        run(["chroot", root, "groupadd", "--gid", str(GID), USER], env=env)
        run(
            [
                "chroot",
                root,
                "useradd",
                "--uid",
                str(UID),
                "--gid",
                str(GID),
                "--no-create-home",
                "--home-dir",
                "/tmp",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ],
            env=env,
        )
        for d in ("models", "data"):
            (root / d).mkdir(exist_ok=True)
        os.chown(root / "data", UID, GID)
        _glob_rm(root, _BASE_CLEAN)
        # a container has no devices of its own; the runtime provides /dev
        for p in (root / "dev").iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
        tmp = out.with_suffix(".tar.part")
        run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-cf", tmp, "."])
        tmp.rename(out)
        log(f"image base: built {out.name} ({out.stat().st_size // (1 << 20)} MiB)")
        return out
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- umoci helpers


def _umoci_config(layout: Path, tag: str, spec: ImageSpec, created: str, extra: list[str]) -> None:
    args = [
        "umoci",
        "config",
        "--image",
        f"{layout}:{tag}",
        "--created",
        created,
        "--author",
        "K-Lake airgap/build_bundle.py",
    ]
    for k, v in sorted(spec.labels.items()):
        args += ["--config.label", f"{k}={v}"]
    run(args + extra, quiet=True)


def _finish(layout: Path, tag: str, out: Path) -> None:
    run(["umoci", "gc", "--layout", layout], quiet=True)
    tmp = out.with_name(out.name + ".part")
    tmp.unlink(missing_ok=True)
    run(["skopeo", "copy", "--quiet", f"oci:{layout}:{tag}", f"oci-archive:{tmp}:{tag}"])
    tmp.rename(out)


def archive_digest(archive: Path) -> str:
    """The manifest digest of a single-image oci-archive (from its index.json)."""
    with tarfile.open(archive) as tf:
        member = tf.extractfile("index.json")
        if member is None:
            raise BundleError(f"{archive}: no index.json")
        index = json.load(member)
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise BundleError(f"{archive}: expected one image in index.json, found {len(manifests)}")
    return manifests[0]["digest"]


def image_from_dirs(
    layers: list[tuple[Path, str]], spec: ImageSpec, out: Path, created: str, config: list[str] | None = None
) -> None:
    """A fresh OCI image with one layer per (source dir, target path), written as an oci-archive.

    Each source directory's content is inserted at its target (``/`` for a whole root filesystem).
    ``config`` adds umoci config flags (user, env, cmd, ...).
    """
    work = Path(tempfile.mkdtemp(prefix="kdbl-oci-", dir=out.parent))
    try:
        layout = work / "layout"
        run(["umoci", "init", "--layout", layout], quiet=True)
        run(["umoci", "new", "--image", f"{layout}:{spec.tag}"], quiet=True)
        for src, target in layers:
            run(
                [
                    "umoci",
                    "insert",
                    "--image",
                    f"{layout}:{spec.tag}",
                    "--history.created",
                    created,
                    "--history.created_by",
                    f"insert {target}",
                    src,
                    target,
                ],
                quiet=True,
            )
        _umoci_config(layout, spec.tag, spec, created, config or [])
        _finish(layout, spec.tag, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# --------------------------------------------------------------------------- the images


SMOKE_MODULES = (
    "kdbl_api.main",
    "kdbl_worker.main",
    "kdbl_operator.main",
    "kdbl_control.cli",
    "llama_cpp",
    "psycopg",
    "tesserocr",  # OCR (the `ocr` extra): its bundled libtesseract loads
    "py7zr",  # .7z members (the `archives` extra): its C codecs load
)


def smoke_test(root: Path, env: dict[str, str]) -> None:
    """Inside the new root: every console script's module imports, llama.cpp loads (libgomp), and
    kdbl-control --help runs as uid 10001. Fails the build with the import error otherwise."""
    failures = []
    for module in SMOKE_MODULES:
        proc = subprocess.run(
            [
                "chroot",
                "--userspec",
                f"{UID}:{GID}",
                str(root),
                f"{VENV}/bin/python",
                "-c",
                f"import {module}",
            ],
            env={**env, "HOME": "/tmp"},
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            failures.append(f"{module}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    if failures:
        raise BundleError(
            "the image's venv is incomplete (a runtime dependency missing from pyproject.toml? add it there, "
            "or pass --extra-requirement):\n  " + "\n  ".join(failures)
        )
    run(
        ["chroot", "--userspec", f"{UID}:{GID}", root, f"{VENV}/bin/kdbl-control", "--help"],
        env={**env, "HOME": "/tmp"},
        capture=True,
        quiet=True,
    )
    log("image smoke test: console scripts import, llama.cpp loads, kdbl-control --help runs as uid 10001")


def pip_wheel(cache: Path) -> Path:
    """A pip wheel (cached) to run from /tmp inside the chroot: ``python pip.whl/pip install ...``."""
    tools = cache / "tools"
    found = sorted(tools.glob("pip-*-py3-none-any.whl"))
    if found:
        return found[-1]
    tools.mkdir(parents=True, exist_ok=True)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "pip",
            "-d",
            tools,
        ]
    )
    found = sorted(tools.glob("pip-*-py3-none-any.whl"))
    if not found:
        raise BundleError(f"pip download pip: no wheel in {tools}")
    return found[-1]


def app_image_key(
    base: Path, wheels: Path, targets: list[str], spec: ImageSpec, pgext_files: dict[str, str]
) -> str:
    """The app image's cache key: everything that goes into it but the creation date."""
    wheel_sums = sorted(f"{p.name}:{sha256_file(p)}" for p in wheels.glob("*.whl"))
    labels = {k: v for k, v in spec.labels.items() if k != "org.opencontainers.image.created"}
    pgext_sums = sorted(pgext_files.items())
    parts = [APP_RECIPE, base.name, wheel_sums, targets, spec.name, spec.tag, labels, pgext_sums]
    return sha256_text(json.dumps(parts))[:16]


def install_pgext(pgext_dir: Path, opt_kdbl: Path) -> Path:
    """The compiled kdbl_bm25 extension into the image's /opt/kdbl as pgext/: root-owned (when building
    as root, as the image build does) and world-readable, for the bundled PostgreSQL's server user."""
    dest = opt_kdbl / "pgext"
    shutil.copytree(pgext_dir, dest)
    for path in [dest, *dest.rglob("*")]:
        if os.geteuid() == 0:
            os.chown(path, 0, 0, follow_symlinks=False)
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def build_app_image(
    *,
    cache: Path,
    mirror: str,
    wheels: Path,
    targets: list[str],
    spec: ImageSpec,
    created: str,
    out_dir: Path,
    pgext: tuple[Path, dict[str, str]],
) -> Path:
    """kdbl/kdbl: Debian base layer + /opt/kdbl layer (venv with ``targets`` installed from the wheelhouse,
    and ``pgext``: (the compiled kdbl_bm25 extension's directory, {file: sha256}) at /opt/kdbl/pgext;
    airgap/pgext.py's build is byte-reproducible, so its hashes key the image like the wheels')."""
    pgext_dir, pgext_files = pgext
    base = build_base_rootfs(cache, mirror)
    key = app_image_key(base, wheels, targets, spec, pgext_files)
    cached = cache / f"app-{key}.oci.tar"
    if not cached.is_file():
        require_root()
        work = Path(tempfile.mkdtemp(prefix="kdbl-app-", dir=cache))
        try:
            root = work / "rootfs"
            root.mkdir()
            run(["tar", "--numeric-owner", "--xattrs", "-C", root, "-xf", base], quiet=True)
            # pip, venv and llama.cpp open /dev/null; a world-writable plain file is enough in this scratch
            # root (only /opt/kdbl is taken from it into the image)
            (root / "dev" / "null").touch()
            os.chmod(root / "dev" / "null", 0o666)
            env = _chroot_env()
            wh = root / "tmp" / "wheels"
            shutil.copytree(wheels, wh)
            pip = pip_wheel(cache)
            shutil.copy2(pip, root / "tmp" / pip.name)
            run(["chroot", root, "python3.11", "-m", "venv", "--without-pip", VENV], env=env)
            run(
                [
                    "chroot",
                    root,
                    f"{VENV}/bin/python",
                    f"/tmp/{pip.name}/pip",
                    "install",
                    "--quiet",
                    "--no-index",
                    "--find-links",
                    "/tmp/wheels",
                    *targets,
                ],
                env=env,
            )
            (root / "tmp" / pip.name).unlink()
            smoke_test(root, env)
            shutil.rmtree(wh)
            app = work / "app"
            (app).mkdir()
            shutil.move(str(root / "opt" / "kdbl"), app / "kdbl")
            install_pgext(pgext_dir, app / "kdbl")
            os.chmod(app, 0o755)
            base_root = work / "base"
            base_root.mkdir()
            run(["tar", "--numeric-owner", "--xattrs", "-C", base_root, "-xf", base], quiet=True)
            image_from_dirs(
                [(base_root, "/"), (app / "kdbl", "/opt/kdbl")],
                spec,
                cached,
                created,
                config=[
                    "--config.user",
                    f"{UID}:{GID}",
                    "--config.workingdir",
                    "/tmp",
                    "--config.env",
                    f"PATH={PATH_ENV}",
                    "--config.env",
                    "LANG=C.UTF-8",
                    "--config.env",
                    "HOME=/tmp",
                    "--config.env",
                    "PYTHONUNBUFFERED=1",
                    "--config.env",
                    "PYTHONDONTWRITEBYTECODE=1",
                    "--config.exposedports",
                    "8080/tcp",
                    "--config.cmd",
                    "kdbl-api",
                ],
            )
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"image {spec.name}:{spec.tag}: cached {cached.name}")
    out = out_dir / spec.archive_name
    _link_or_copy(cached, out)
    os.utime(cached)  # most recently used, for prune_cache
    prune_cache(cache)
    return out


def build_model_image(*, cache: Path, model: Path, spec: ImageSpec, created: str, out_dir: Path,
                      chat: Path | None = None) -> Path:
    """kdbl/kdbl-model: one layer with the GGUF file (and the answer tool's chat model, when the bundle has
    one) at the image root (a Kubernetes image volume)."""
    labels = {k: v for k, v in spec.labels.items() if k != "org.opencontainers.image.created"}
    files = [model] + ([chat] if chat is not None else [])
    parts: list = [MODEL_RECIPE, model.name, sha256_file(model), spec.name, spec.tag, labels]
    if chat is not None:  # without one the key (and so the cached image) is what it always was
        parts += [chat.name, sha256_file(chat)]
    key = sha256_text(json.dumps(parts))[:16]
    cached = cache / f"model-{key}.oci.tar"
    if not cached.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="kdbl-model-", dir=cache))
        try:
            src = work / "root"
            src.mkdir(mode=0o755)
            os.chmod(src, 0o755)
            for file in files:
                shutil.copy2(file, src / file.name)
                os.chmod(src / file.name, 0o644)
                if os.geteuid() == 0:
                    os.chown(src / file.name, 0, 0)
            image_from_dirs([(src, "/")], spec, cached, created)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"image {spec.name}:{spec.tag}: cached {cached.name}")
    out = out_dir / spec.archive_name
    _link_or_copy(cached, out)
    os.utime(cached)
    prune_cache(cache)
    return out


def prune_cache(cache: Path, keep: int = 3) -> None:
    """Keep the `keep` newest finished images of each kind (app-*, model-*) in the cache."""
    for prefix in ("app-", "model-"):
        archives = sorted(cache.glob(f"{prefix}*.oci.tar"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in archives[keep:]:
            old.unlink(missing_ok=True)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
