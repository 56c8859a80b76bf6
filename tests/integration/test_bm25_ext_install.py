"""How the kdbl_bm25 extension gets into a database (kdbl_core.db.pgext.INSTALL_SQL, run by
migrate.install_extension after every migration), issue 27: a database at 1.0 — every role could execute
its functions — is updated to 1.1 with exactly the privileges and markings of a fresh install; a 1.0 the
server cannot update is locked down all the same; where the migrator is no superuser (CloudNativePG, an
external server) a DBA creates the extension (it is not trusted) and the migrator grants it to K-Lake's
roles, and to no one else; a role not granted kdbl_bm25_pack skips the list build.

Each test makes a scratch database on the session's server. The 1.0 install script is the released one,
kept in tests/data/pgext (the package ships only 1.1 and the update script).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from kdbl_core.content import bm25_lists
from kdbl_core.db import migrate, pgext
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role, normalise

HISTORY = Path(__file__).resolve().parents[1] / "data" / "pgext"
TOPK = "kdbl_bm25_topk(bytea, bigint, integer, integer, float8, float8, float8, integer, bigint[])"
# Every function of the extension: owner, PARALLEL marking, access list (or NULL: the default, PUBLIC may)
PRIVILEGES = """
SELECT p.proname, pg_get_userbyid(p.proowner), p.proparallel,
       CAST(ARRAY(SELECT CAST(a AS text) FROM unnest(p.proacl) a ORDER BY 1) AS text[])
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'kdbl_bm25') AND d.deptype = 'e'
   AND d.classid = CAST('pg_proc' AS regclass)
 ORDER BY 1
"""
WHO_MAY = """
SELECT r.rolname, p.proname
  FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
 CROSS JOIN (SELECT rolname FROM pg_roles WHERE rolname IN ('kdbl_api', 'kdbl_worker', 'kdbl_admin')
             UNION ALL SELECT 'public') r
 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'kdbl_bm25') AND d.deptype = 'e'
   AND d.classid = CAST('pg_proc' AS regclass) AND has_function_privilege(r.rolname, p.oid, 'EXECUTE')
 ORDER BY 1, 2
"""
K_LAKE_ROLES_MAY = [("kdbl_admin", "kdbl_bm25_pack"), ("kdbl_admin", "kdbl_bm25_topk"),
                    ("kdbl_admin", "kdbl_bm25_unpack"), ("kdbl_api", "kdbl_bm25_topk"),
                    ("kdbl_api", "kdbl_bm25_unpack"), ("kdbl_worker", "kdbl_bm25_pack")]


def _url(owner_url: str, database: str, user: str | None = None) -> str:
    url = make_url(normalise(owner_url)).set(database=database)
    return (url.set(username=user) if user else url).render_as_string(hide_password=False)


@pytest.fixture
def scratch_db(owner_url, unique):
    """A fresh database (dropped after), and a role to own it when a test wants one."""
    name = f"kdbl_ext_{unique}"
    made_roles: list[str] = []
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        def create(owner: str | None = None) -> str:
            if owner:
                password = make_url(normalise(owner_url)).password
                conn.execute(f"CREATE ROLE {owner} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD "
                             + conn.execute("SELECT quote_literal(%s)", [password]).fetchone()[0])
                made_roles.append(owner)
            conn.execute(f"CREATE DATABASE {name}" + (f" OWNER {owner}" if owner else ""))
            return name

        yield create
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        for role in made_roles:
            conn.execute(f"DROP ROLE {role}")


def _fetch(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        return conn.execute(sql).fetchall()


def test_a_database_at_1_0_is_updated_to_1_1_with_the_privileges_of_a_fresh_install(
        owner_url, scratch_db, tmp_path):
    db = _url(owner_url, scratch_db())
    # the server's extension directory with the released 1.0 install script beside it (this session only)
    extension = tmp_path / "share" / "extension"
    extension.mkdir(parents=True)
    built = pgext.default_dir() / "share" / "extension"
    for name in (f"{pgext.NAME}.control", *pgext.SCRIPTS):
        shutil.copy2(built / name, extension / name)
    shutil.copy2(HISTORY / "kdbl_bm25--1.0.sql", extension / "kdbl_bm25--1.0.sql")
    with psycopg.connect(conninfo(db), autocommit=True) as conn:
        conn.execute(f"SET extension_control_path = '{tmp_path / 'share'}'")
        conn.execute("CREATE EXTENSION kdbl_bm25 VERSION '1.0'")
        assert conn.execute(f"SELECT has_function_privilege('public', '{TOPK}', 'EXECUTE')").fetchone()[0]
        assert conn.execute("SELECT proparallel FROM pg_proc WHERE proname = 'kdbl_bm25_topk'").fetchone() == ("u",)

    assert migrate.install_extension(db)  # as the embedded server's migrator does, after the migrations

    assert _fetch(db, "SELECT extversion FROM pg_extension WHERE extname = 'kdbl_bm25'") == [(pgext.VERSION,)]
    fresh = _fetch(owner_url, PRIVILEGES)  # the session's database: created at 1.1
    assert _fetch(db, PRIVILEGES) == fresh
    assert _fetch(db, WHO_MAY) == K_LAKE_ROLES_MAY
    assert migrate.install_extension(db) and _fetch(db, PRIVILEGES) == fresh  # again: nothing changes


def test_a_database_at_1_0_whose_server_lacks_1_1_is_still_locked_down(owner_url, scratch_db, tmp_path):
    """The chart's migration Job may run before the PostgreSQL pod has the new files: the 1.0 stays, but
    PUBLIC loses EXECUTE and K-Lake's roles get what they call."""
    extension = tmp_path / "share" / "extension"
    extension.mkdir(parents=True)
    control = (pgext.default_dir() / "share" / "extension" / f"{pgext.NAME}.control").read_text()
    (extension / f"{pgext.NAME}.control").write_text(control.replace("default_version = '1.1'",
                                                                     "default_version = '1.0'"))
    shutil.copy2(HISTORY / "kdbl_bm25--1.0.sql", extension / "kdbl_bm25--1.0.sql")
    with psycopg.connect(conninfo(_url(owner_url, scratch_db())), autocommit=True) as conn:
        conn.execute(f"SET extension_control_path = '{tmp_path / 'share'}'")  # a server with 1.0 only
        conn.execute("CREATE EXTENSION kdbl_bm25")
        assert ("public", "kdbl_bm25_topk") in conn.execute(WHO_MAY).fetchall()
        conn.execute(pgext.INSTALL_SQL)
        assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'kdbl_bm25'").fetchone() == \
            ("1.0",)
        assert conn.execute(WHO_MAY).fetchall() == K_LAKE_ROLES_MAY


def test_a_migrator_that_is_no_superuser_grants_the_extension_a_superuser_created_to_k_lakes_roles_only(
        owner_url, scratch_db, unique):
    """Not trusted, as pgvector: only a superuser loads its C code into the server. Where the migrator is
    none (CloudNativePG's application owner, an external server), a DBA creates the extension and the
    migrator, as the database's owner, grants it on."""
    migrator = f"kdbl_mig_{unique}"
    name = scratch_db(owner=migrator)
    as_migrator, as_superuser = _url(owner_url, name, user=migrator), _url(owner_url, name)

    assert not migrate.install_extension(as_migrator)  # permission denied: a warning, the SQL top-k
    assert _fetch(as_superuser, "SELECT count(*) FROM pg_extension WHERE extname = 'kdbl_bm25'") == [(0,)]
    with psycopg.connect(conninfo(as_superuser), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION kdbl_bm25")  # the DBA
    assert migrate.install_extension(as_migrator)

    assert {row[1] for row in _fetch(as_superuser, PRIVILEGES)} == {make_url(normalise(owner_url)).username}
    assert _fetch(as_superuser, WHO_MAY) == K_LAKE_ROLES_MAY
    with psycopg.connect(conninfo(as_migrator), autocommit=True) as conn:  # the owner may call them too
        top = conn.execute("SELECT kdbl_bm25_topk(NULL, 7, 1, 1, 1.0, 0.003, 0.3, 5, NULL)").fetchone()[0]
        assert top == [7.0, 1 / (1 + (0.3 + 0.003))]


def test_a_role_not_granted_kdbl_bm25_pack_skips_the_list_build(owner_url):
    with psycopg.connect(conninfo(for_role(owner_url, "kdbl_api"))) as conn:  # the API searches, never packs
        assert "not granted to this role" in bm25_lists.build(conn, uuid.uuid4())["skipped"]
    with psycopg.connect(conninfo(for_role(owner_url, "kdbl_worker"))) as conn:
        assert bm25_lists.extension_installed(conn)
