"""Connection URLs: normalise to the psycopg driver and derive runtime-role URLs."""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy.engine import URL, make_url

RUNTIME_ROLES = ("kdbl_api", "kdbl_worker")


def normalise(url: str) -> URL:
    """Accept postgres://, postgresql:// or postgresql+psycopg:// URLs (libpq socket URLs too)."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


def socket_url(user: str, database: str, socket_dir: str, password: str | None = None) -> str:
    """A URL for a server listening on a Unix socket in `socket_dir` (the embedded server)."""
    secret = f":{quote(password, safe='')}" if password is not None else ""
    return (f"postgresql+psycopg://{quote(user, safe='')}{secret}@/{quote(database, safe='')}"
            f"?host={quote(socket_dir, safe='')}")


def for_role(url: str, role: str) -> str:
    """The same server, database and password, connecting as another role.

    Used by the embedded default and the tests, whose runtime roles share the superuser's generated
    password (kdbl_core.db.embedded); production gives each service its own URL.
    """
    return normalise(url).set(username=role).render_as_string(hide_password=False)
