"""The llama-cpp-python wheel `./dev` installs, from one wheelhouse per machine keyed by version and build flags.

llama-cpp-python is compiled from source (~10-14 minutes on 2 cores): acceptable once, not per clone. `./dev`
used to leave it to pip, whose wheel cache is keyed by the sdist alone (a change of CMAKE_ARGS reused a wheel
built with other flags) and which the airgap build did not share. Now `./dev`, in every clone and after every
pyproject.toml change, and the airgap build use one cache: build_bundle.llama_wheel's,
`$KDBL_AIRGAP_CACHE/llama/<version>-<hash of version and CMAKE_ARGS>/` (default ~/.cache/kdbl/airgap). This
prints the path of the wheel for the project's llama-cpp-python requirement and this process's CMAKE_ARGS,
building it first when the cache has none. The version: the newest sdist already in the cache that satisfies
the requirement (no network needed), else the newest the index offers.

Usage: python airgap/llama_wheelhouse.py   (run by ./dev with the venv's python; build output on stderr)
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_bundle import default_cache, llama_requirement, llama_wheel, run  # noqa: E402

from pip._vendor.packaging.requirements import Requirement  # noqa: E402 - the venv has pip, not packaging
from pip._vendor.packaging.version import Version  # noqa: E402

_SDIST = re.compile(r"llama_cpp_python-(?P<version>[^-]+)\.tar\.gz$")


def _cached_versions(sdist_dir: Path) -> list[Version]:
    found = (_SDIST.match(p.name) for p in sdist_dir.glob("llama_cpp_python-*.tar.gz"))
    return sorted(Version(m["version"]) for m in found if m)


def resolve_version(python: str, requirement: Requirement, sdist_dir: Path) -> str:
    """The newest cached sdist that satisfies `requirement`, else the newest on the index (downloaded)."""
    local = [v for v in _cached_versions(sdist_dir) if v in requirement.specifier]
    if local:
        return str(local[-1])
    sdist_dir.mkdir(parents=True, exist_ok=True)
    run([python, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", str(requirement),
         "-d", str(sdist_dir)])
    fresh = [v for v in _cached_versions(sdist_dir) if v in requirement.specifier]
    if not fresh:
        raise SystemExit(f"pip download gave no llama-cpp-python sdist satisfying {requirement} in {sdist_dir}")
    return str(fresh[-1])


def main() -> int:
    out = os.dup(1)
    os.dup2(2, 1)  # pip's and the compiler's output go to stderr: stdout is the wheel's path alone
    try:
        cache = default_cache()
        requirement = Requirement(llama_requirement())
        version = resolve_version(sys.executable, requirement, cache / "sdist")
        wheel = llama_wheel(sys.executable, cache, version, os.environ.get("CMAKE_ARGS", ""))
    finally:
        sys.stdout.flush()
        os.dup2(out, 1)
        os.close(out)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
