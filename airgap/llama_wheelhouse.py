"""The llama-cpp-python wheel, built from source once per version and build flags, for the airgap build and ./dev.

llama-cpp-python has no binary wheel on PyPI: it is compiled (~6-14 minutes on 2 cores). One cache keyed by
version and CMAKE_ARGS, `$KDBL_AIRGAP_CACHE/llama/<version>-<hash of version and CMAKE_ARGS>/` (default
~/.cache/kdbl/airgap), serves the airgap build (build_bundle: portable flags, -DGGML_NATIVE=OFF) and `./dev`
(this module run as a script: the flags of the caller's CMAKE_ARGS) in every clone and after every
pyproject.toml change; pip's own wheel cache, keyed by the sdist alone, reused a wheel built with other flags.

Usage: python airgap/llama_wheelhouse.py   (run by ./dev with the venv's python; prints the wheel's path,
building it first when the cache has none; build output on stderr)
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
import json
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bundlelib import (  # noqa: E402
    REPO_ROOT, BundleError, clean_pip_env, default_cache, human_size, log, normalize_dist, run, sha256_text,
)

_SDIST = re.compile(r"llama_cpp_python-(?P<version>[^-]+)\.tar\.gz$")


def llama_requirement() -> str:
    """The project's llama-cpp-python requirement, from pyproject.toml."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for dep in project["dependencies"]:
        if normalize_dist(re.split(r"[<>=!~\[; ]", dep, maxsplit=1)[0]) == "llama-cpp-python":
            return dep.replace(" ", "")
    raise BundleError("pyproject.toml does not depend on llama-cpp-python")


def _satisfying(requirement: str, versions: list[str]) -> list[str]:
    """`versions` that satisfy `requirement`, oldest first (pip vendors packaging; a bare venv has no other)."""
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    spec = Requirement(requirement).specifier
    return sorted((v for v in versions if spec.contains(v)), key=Version)


def resolve_llama_version(python: str, requirement: str, sdist_dir: Path | None = None) -> str:
    """The llama-cpp-python version to build: the running environment's when it satisfies the requirement (the
    bundle matches what was tested), else the newest sdist already in `sdist_dir` that does (no network), else
    the newest on the index (its sdist downloaded there)."""
    try:
        installed = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        installed = ""
    if installed and _satisfying(requirement, [installed]):
        return installed
    sdist_dir = sdist_dir or default_cache() / "sdist"
    def cached() -> list[str]:
        found = (_SDIST.match(p.name) for p in sdist_dir.glob("llama_cpp_python-*.tar.gz"))
        return _satisfying(requirement, [m["version"] for m in found if m])
    if not cached():
        sdist_dir.mkdir(parents=True, exist_ok=True)
        run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", requirement,
             "-d", sdist_dir])
    versions = cached()
    if not versions:
        raise BundleError(f"pip download gave no llama-cpp-python sdist satisfying {requirement} in {sdist_dir}")
    return versions[-1]


def llama_wheel(python: str, cache: Path, version: str, cmake_args: str) -> Path:
    """A portable llama-cpp-python wheel, built from the sdist once per (version, CMAKE_ARGS)."""
    key = f"{version}-{sha256_text(version + '|' + cmake_args)[:12]}"
    out_dir = cache / "llama" / key
    found = sorted(out_dir.glob("llama_cpp_python-*.whl")) if out_dir.is_dir() else []
    if found:
        log(f"llama-cpp-python {version}: cached wheel {found[0]} ({human_size(found[0].stat().st_size)})")
        return found[0]
    sdist_dir = cache / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not sdists:
        run(
            [
                python,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={version}",
                "-d",
                sdist_dir,
            ]
        )
        sdists = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
        if not sdists:
            raise BundleError(
                f"pip download did not produce llama_cpp_python-{version}.tar.gz in {sdist_dir}"
            )
    tmp = out_dir.with_name(key + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(
        f"llama-cpp-python {version}: building from source with CMAKE_ARGS={cmake_args!r} "
        "(≈6-10 min on 2 cores; cached afterwards)"
    )
    t0 = time.monotonic()
    env = clean_pip_env(CMAKE_ARGS=cmake_args, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    run([python, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", tmp, sdists[0]], env=env)
    wheels = sorted(tmp.glob("llama_cpp_python-*.whl"))
    if len(wheels) != 1:
        raise BundleError(f"expected one llama-cpp-python wheel in {tmp}, found {wheels}")
    (tmp / "BUILD.json").write_text(
        json.dumps({"version": version, "cmake_args": cmake_args, "seconds": round(time.monotonic() - t0)})
        + "\n"
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    wheel = out_dir / wheels[0].name
    log(
        f"llama-cpp-python {version}: built {wheel.name} ({human_size(wheel.stat().st_size)}) "
        f"in {time.monotonic() - t0:.0f} s"
    )
    return wheel


def main() -> int:
    out = os.dup(1)
    os.dup2(2, 1)  # pip's and the compiler's output go to stderr: stdout is the wheel's path alone
    try:
        cache = default_cache()
        version = resolve_llama_version(sys.executable, llama_requirement(), cache / "sdist")
        wheel = llama_wheel(sys.executable, cache, version, os.environ.get("CMAKE_ARGS", ""))
    finally:
        sys.stdout.flush()
        os.dup2(out, 1)
        os.close(out)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
