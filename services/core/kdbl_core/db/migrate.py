"""Apply migrations (as the owner) and manage the login of the runtime roles."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
from psycopg import sql
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, pool, text
from sqlalchemy.exc import DBAPIError

from kdbl_core.db import pgext
from kdbl_core.db.urls import RUNTIME_ROLES, normalise

log = logging.getLogger(__name__)
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def _config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_MIGRATIONS))
    cfg.attributes["url"] = normalise(url)
    return cfg


def upgrade(owner_url: str, revision: str = "head") -> None:
    command.upgrade(_config(owner_url), revision)
    install_extension(owner_url)


def install_extension(owner_url: str) -> bool:
    """Create (or update) the kdbl_bm25 extension when the server offers it; True when it is installed.
    A server without it, or a role that may not create it, keeps the SQL top-k (a warning says why)."""
    engine = create_engine(normalise(owner_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(pgext.INSTALL_SQL)
            installed = conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = :n"),
                                     {"n": pgext.NAME}).scalar()
    except DBAPIError as exc:
        log.warning("kdbl_bm25 extension not installed: keyword search uses the SQL top-k",
                    extra={"reason": str(exc.orig).strip()[:300]})
        return False
    finally:
        engine.dispose()
    if installed is None:
        log.info("kdbl_bm25 extension not offered by this server: keyword search uses the SQL top-k")
    return installed is not None


def downgrade(owner_url: str, revision: str) -> None:
    command.downgrade(_config(owner_url), revision)


def current_revision(owner_url: str) -> str | None:
    engine = create_engine(normalise(owner_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            exists = conn.execute(text("SELECT to_regclass('public.alembic_version')")).scalar()
            if not exists:
                return None
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()


def set_password_sql(conn: psycopg.Connection, role: str, password: str, *, login: bool = False) -> str:
    """`ALTER ROLE role [LOGIN] PASSWORD '<verifier>'`: the password as the SCRAM-SHA-256 verifier PostgreSQL
    stores, computed here (libpq's PQencryptPasswordConn, as psql's \\password does), so a server that logs
    statements (log_statement = 'ddl') or tracks them (pg_stat_statements keeps a utility statement's text as
    sent) records a salted verifier, not the password. ALTER ROLE takes no bind parameters: role and verifier
    are quoted here, by psycopg, for this connection."""
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    statement = "ALTER ROLE {} LOGIN PASSWORD {}" if login else "ALTER ROLE {} PASSWORD {}"
    return sql.SQL(statement).format(sql.Identifier(role), sql.Literal(verifier)).as_string(conn)


def enable_login(owner_url: str, passwords: dict[str, str | None]) -> None:
    """Let the runtime roles log in; with a password where one is given (production)."""
    engine = create_engine(normalise(owner_url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            for role, password in passwords.items():
                if role not in RUNTIME_ROLES:
                    raise ValueError(f"not a runtime role: {role}")
                if password:
                    raw = conn.connection.dbapi_connection
                    assert isinstance(raw, psycopg.Connection)
                    # as the driver's text: SQLAlchemy's text() would read the verifier's ":…" as a bind parameter
                    conn.exec_driver_sql(set_password_sql(raw, role, password, login=True))
                else:
                    conn.execute(text(f"ALTER ROLE {role} LOGIN"))
    finally:
        engine.dispose()
