"""Connection URLs as plain strings: accept the forms the settings allow, derive runtime-role URLs.

Accepted: postgres://, postgresql:// and postgresql+psycopg:// URLs, libpq socket URLs (`@/db?host=/dir`),
several hosts (`h1:5432,h2:5433`) and percent-encoded passwords with any character. `normalise` writes the
one form the project hands around (postgresql+psycopg://, which the tests' and the migrations' SQLAlchemy
read as psycopg 3); `libpq` is the same URL as libpq reads it (postgresql://), what the psycopg pools get.
No SQLAlchemy here: urllib splits the URL and libpq's own parser (psycopg.conninfo) validates it, so a
URL that would fail at connect time fails here as a ConfigError that does not echo the password.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from psycopg import ProgrammingError
from psycopg.conninfo import conninfo_to_dict

from kdbl_core.errors import ConfigError

RUNTIME_ROLES = ("kdbl_api", "kdbl_worker")
SCHEMES = ("postgres", "postgresql", "postgresql+psycopg")
_WRITTEN = "postgresql+psycopg"


def _split(url: str) -> tuple[str | None, str | None, str, str]:
    """(user, password, hosts, "/database?query") of an accepted URL; user and password percent-decoded.

    The authority ends at the first "/" or "?" (libpq's rule: a password holding either is
    percent-encoded); its last "@" ends the user information, so a bare "@" in a password still works."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ConfigError("the database URL cannot be used: it must start with "
                          + ", ".join(f"{s}://" for s in SCHEMES))
    ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
    authority, tail = rest[:min(ends, default=len(rest))], rest[min(ends, default=len(rest)):]
    userinfo, at, hosts = authority.rpartition("@")
    if not at:
        return None, None, hosts, tail
    user, colon, password = userinfo.partition(":")
    return unquote(user), unquote(password) if colon else None, hosts, tail


def _join(scheme: str, user: str | None, password: str | None, hosts: str, tail: str) -> str:
    userinfo = "" if user is None else quote(user, safe="")
    if password is not None:
        userinfo += f":{quote(password, safe='')}"
    return f"{scheme}://{userinfo}{'@' if user is not None else ''}{hosts}{tail}"


def normalise(url: str) -> str:
    """Any accepted URL as postgresql+psycopg://…; ConfigError for one libpq could not use."""
    user, password, hosts, tail = _split(url)
    libpq_form = _join("postgresql", user, password, hosts, tail)
    try:
        conninfo_to_dict(libpq_form)
    except ProgrammingError as exc:  # libpq's reason, which may quote the whole URL (and its password)
        reason = str(exc).strip().replace(libpq_form, "<url>").splitlines()
        raise ConfigError(f"the database URL cannot be used: {reason[0] if reason else 'invalid'}") from None
    return _WRITTEN + libpq_form[len("postgresql"):]


def libpq(url: str) -> str:
    """The URL libpq (psycopg) connects with: postgresql://…"""
    return "postgresql" + normalise(url)[len(_WRITTEN):]


def socket_url(user: str, database: str, socket_dir: str, password: str | None = None) -> str:
    """A URL for a server listening on a Unix socket in `socket_dir` (the embedded server)."""
    return _join(_WRITTEN, user, password, "", f"/{quote(database, safe='')}?host={quote(socket_dir, safe='')}")


def for_role(url: str, role: str) -> str:
    """The same server, database and password, connecting as another role.

    Used by the embedded default and the tests, whose runtime roles share the superuser's generated
    password (kdbl_core.db.embedded_postgres); production gives each service its own URL.
    """
    _user, password, hosts, tail = _split(normalise(url))
    return _join(_WRITTEN, role, password, hosts, tail)
