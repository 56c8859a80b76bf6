"""Setting a runtime role's password (kdbl_core.db.migrate.enable_login: `kdbl-control db migrate`, the
embedded server's start): the statement carries a SCRAM verifier computed by libpq, never the password, so a
server that logs DDL or tracks statements (pg_stat_statements keeps a utility statement's text as sent) does
not record the secret — and the role logs in with the password as before."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict
from sqlalchemy import event
from sqlalchemy.engine import Engine

from kdbl_core.db import migrate
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role


def test_a_runtime_roles_password_goes_to_the_server_as_a_verifier_and_still_logs_in(owner_url):
    password = conninfo_to_dict(conninfo(for_role(owner_url, "kdbl_api")))["password"]
    assert password and len(password) >= 16
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001 - SQLAlchemy's hook
        sent.append(f"{statement} {parameters!r}")

    event.listen(Engine, "before_cursor_execute", record)
    try:
        migrate.enable_login(owner_url, {"kdbl_api": password, "kdbl_worker": password})  # the passwords they have
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    altered = [s for s in sent if s.startswith("ALTER ROLE")]
    assert len(altered) == 2 and all("PASSWORD 'SCRAM-SHA-256$4096:" in s for s in altered), altered
    assert not any(password in s for s in sent)
    for role in ("kdbl_api", "kdbl_worker"):
        with psycopg.connect(conninfo(for_role(owner_url, role))) as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == role


def test_the_password_statement_on_a_psycopg_connection_sets_a_verifier_the_role_logs_in_with(owner_url):
    """The embedded server's adoption of a data dir from an earlier release sends it on psycopg directly."""
    password = conninfo_to_dict(conninfo(for_role(owner_url, "kdbl_api")))["password"]
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        statement = migrate.set_password_sql(conn, "kdbl_api", password)
        assert statement.startswith('ALTER ROLE "kdbl_api" PASSWORD \'SCRAM-SHA-256$4096:') and password not in statement
        conn.execute(statement)
    with psycopg.connect(conninfo(for_role(owner_url, "kdbl_api"))) as conn:
        assert conn.execute("SELECT current_user").fetchone()[0] == "kdbl_api"
