"""Row-level security is enforced by Postgres itself, for the runtime roles, on every tenant table."""

from __future__ import annotations

import pytest
from helpers import db_of, make_corpus
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, ProgrammingError

from kdbl_control import admin
from kdbl_core.access.principal import Principal, principal_params

TENANT_TABLES = ["tenants", "sources", "files", "chunks", "postings", "term_stats", "corpus_stats", "grants",
                 "source_stats", "bm25_lists", "bm25_built"]
# Empty for alice here: no grants at all; postings rows, which writers leave to packed lists where the
# database has the kdbl_bm25 extension (as the test server does).
MAY_BE_EMPTY = {"grants", "postings"}
SET = text("SELECT set_config('kdbl.tenant_id', :tenant, true), set_config('kdbl.subjects', :subjects, true)")


@pytest.fixture
def two_tenants(owner_engine, worker_engine, tmp_path, unique):
    a = make_corpus(owner_engine, worker_engine, tmp_path / f"a-{unique}", {
        "alpha.md": "# Alpha\n\nThe zebrafish protocol of tenant alpha.", "notes.txt": "alpha private notes"},
        tenant=f"alpha-{unique}")
    b = make_corpus(owner_engine, worker_engine, tmp_path / f"b-{unique}", {
        "beta.md": "# Beta\n\nThe zebrafish protocol of tenant beta."}, tenant=f"beta-{unique}")
    admin.add_grant(db_of(owner_engine), source_id=b.source_id, subject="user:bob")
    return a, b


def _as(engine, principal: Principal, sql: str):
    with engine.begin() as conn:
        conn.execute(SET, principal_params(principal))
        return conn.execute(text(sql)).mappings().all()


def _principal(corpus, subject="user:alice", groups=()) -> Principal:
    return Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject=subject, groups=tuple(groups))


@pytest.mark.parametrize("table", TENANT_TABLES)
def test_api_role_select_star_returns_only_the_principals_tenant(api_sync_engine, two_tenants, table):
    a, b = two_tenants
    rows = _as(api_sync_engine, _principal(a), f"SELECT * FROM {table}")
    tenant_col = "id" if table == "tenants" else "tenant_id"
    if table not in MAY_BE_EMPTY:
        assert rows, f"alice should see her own {table} rows"
    assert {r[tenant_col] for r in rows} <= {a.tenant_id}
    rows_b = _as(api_sync_engine, _principal(b, "user:bob"), f"SELECT * FROM {table}")
    assert {r[tenant_col] for r in rows_b} <= {b.tenant_id}


@pytest.mark.parametrize("table", TENANT_TABLES)
def test_no_principal_means_no_rows(api_sync_engine, two_tenants, table):
    with api_sync_engine.begin() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() == 0


def test_worker_role_sees_content_of_one_tenant_only(worker_engine, two_tenants):
    a, b = two_tenants
    rows = _as(worker_engine, _principal(a), "SELECT DISTINCT tenant_id FROM chunks")
    assert [r["tenant_id"] for r in rows] == [a.tenant_id]


def test_api_role_cannot_read_tokens_or_audit(api_sync_engine, two_tenants):
    a, _ = two_tenants
    for table in ("tokens", "audit"):
        with pytest.raises(ProgrammingError, match="permission denied"):
            _as(api_sync_engine, _principal(a), f"SELECT * FROM {table}")


@pytest.mark.parametrize("statement", [
    "ALTER TABLE chunks DISABLE ROW LEVEL SECURITY",
    "ALTER TABLE chunks NO FORCE ROW LEVEL SECURITY",
    "DROP POLICY api_read ON chunks",
    "SET ROLE kdbl_admin",
    "SET ROLE {other_runtime_role}",
    "SET ROLE postgres",
    "SET SESSION AUTHORIZATION postgres",
    "SET row_security = off; SELECT count(*) FROM chunks",
])
@pytest.mark.parametrize("role_engine", ["api_sync_engine", "worker_engine"])
def test_runtime_roles_cannot_switch_rls_off_or_change_role(request, role_engine, statement, two_tenants):
    engine = request.getfixturevalue(role_engine)
    other = "kdbl_worker" if role_engine == "api_sync_engine" else "kdbl_api"
    with pytest.raises(DBAPIError):
        with engine.begin() as conn:
            conn.execute(text(statement.format(other_runtime_role=other)))


def test_runtime_roles_are_not_privileged(api_sync_engine, worker_engine):
    for engine in (api_sync_engine, worker_engine):
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user")).one()
            owns = conn.execute(text("SELECT count(*) FROM pg_tables WHERE tableowner = current_user")).scalar()
        assert tuple(row) == (False, False) and owns == 0


def test_restricted_source_needs_a_grant_and_file_grants_open_one_file(
        owner_engine, worker_engine, api_sync_engine, tmp_path, unique):
    c = make_corpus(owner_engine, worker_engine, tmp_path / f"r-{unique}", {
        "secret.md": "classified quokka report", "open.md": "public quokka leaflet"},
        tenant=f"restr-{unique}", restricted=True)
    alice = _principal(c, "user:alice")
    keys = "SELECT f.key FROM files f ORDER BY f.key"
    chunk_count = "SELECT count(*) AS n FROM chunks"
    assert _as(api_sync_engine, alice, keys) == []
    assert _as(api_sync_engine, alice, chunk_count)[0]["n"] == 0
    assert _as(api_sync_engine, alice, "SELECT id FROM sources") == []

    admin.add_grant(db_of(owner_engine), source_id=c.source_id, subject="user:alice", file_key="open.md")
    assert [r["key"] for r in _as(api_sync_engine, alice, keys)] == ["open.md"]
    assert _as(api_sync_engine, alice, chunk_count)[0]["n"] == 1
    assert len(_as(api_sync_engine, alice, "SELECT id FROM sources")) == 1

    admin.add_grant(db_of(owner_engine), source_id=c.source_id, subject="group:analysts")
    analyst = _principal(c, "user:carol", groups=["analysts"])
    assert [r["key"] for r in _as(api_sync_engine, analyst, keys)] == ["open.md", "secret.md"]
    # the packed lists (here the writers' own generations) follow their source: alice, granted one file,
    # reads none of them (her file's terms come from its chunk's row); the analysts, granted the source, do
    assert _as(api_sync_engine, alice, "SELECT count(*) AS n FROM bm25_lists")[0]["n"] == 0
    assert _as(api_sync_engine, analyst, "SELECT count(*) AS n FROM bm25_lists")[0]["n"] > 0
