"""A hot standby of an embedded PostgreSQL, from the same binaries: `kdbl-control bench replica` and the read
replica tests (issue 32) run against real streaming replication, not an imitation of it.

`pg_basebackup -R` copies the running primary (a base backup plus `standby.signal` and the primary's
connection info) over its unix socket; the standby then streams and replays the primary's WAL, refuses writes,
and can be paused (`pg_wal_replay_pause()`), killed and promoted like any standby. It runs with the settings
docs/scaling.md §1.4 names for read replicas: `hot_standby_feedback = on` and `max_standby_streaming_delay`
(5 s unless asked otherwise). No TCP listener: its own socket directory, 0700, as the primary's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import psycopg

from kdbl_core.db.embedded_postgres import DATABASE, SUPERUSER, EmbeddedDatabase, as_server_user, pg_binary
from kdbl_core.db.urls import for_role, socket_url
from kdbl_core.errors import ConfigError
from kdbl_core.settings import child_env

REPLICATION_HBA = "local replication all scram-sha-256\n"
START_BOUND_S = 120.0  # a bound on a condition (accepting connections, replayed up to), not a wait
POLL_S = 0.05


def conninfo(url: str) -> str:
    """A URL of kdbl_core.db.urls as libpq takes it."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def allow_replication(primary: EmbeddedDatabase) -> None:
    """Let the primary's superuser stream WAL over its socket (the embedded pg_hba.conf has no replication
    line); until the primary next starts, which writes its pg_hba.conf again."""
    hba = primary.pgdata / "pg_hba.conf"
    if REPLICATION_HBA not in hba.read_text():
        hba.write_text(hba.read_text() + REPLICATION_HBA)
    with psycopg.connect(conninfo(primary.owner_url), autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")


class Standby:
    """A hot standby of `primary` in `path` (its own data and socket directories)."""

    def __init__(self, primary: EmbeddedDatabase, path: Path, *, streaming_delay: str = "5s") -> None:
        self.primary = primary
        self.path = path
        self.pgdata = path / "pgdata"
        self.socket_dir = path / "sock"
        self.streaming_delay = streaming_delay
        self.process: subprocess.Popen | None = None
        self._password = primary.password_file.read_text().strip()

    def url(self, role: str | None = None) -> str:
        """The standby's URL, as the superuser or (given) a runtime role (same passwords: replicated)."""
        owner = socket_url(SUPERUSER, DATABASE, str(self.socket_dir), self._password)
        return for_role(owner, role) if role else owner

    def create(self) -> None:
        """The base backup of the running primary (with -R: standby.signal and primary_conninfo)."""
        allow_replication(self.primary)
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        primary_socket = unquote(self.primary.owner_url.split("host=")[-1].split("&")[0])
        argv = as_server_user([pg_binary("pg_basebackup"), "-D", str(self.pgdata), "-R", "-X", "stream",
                               "-c", "fast", "-h", primary_socket, "-U", SUPERUSER])
        done = subprocess.run(argv, env=child_env({"PGPASSWORD": self._password}), capture_output=True,
                              text=True, timeout=3600)
        if done.returncode != 0:
            raise ConfigError(f"pg_basebackup failed: {done.stderr.strip()[-800:]}")

    def start(self) -> None:
        """Start the standby; returns once it accepts read-only connections."""
        argv = as_server_user([
            pg_binary("postgres"), "-D", str(self.pgdata), "-c", "listen_addresses=",
            "-c", f"unix_socket_directories={self.socket_dir}", "-c", "hot_standby=on",
            "-c", "hot_standby_feedback=on", "-c", f"max_standby_streaming_delay={self.streaming_delay}"])
        with open(self.path / "log", "ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                            start_new_session=True)
        deadline = time.monotonic() + START_BOUND_S
        while True:
            if self.process.poll() is not None:
                raise ConfigError("the standby exited: " + (self.path / "log").read_text(errors="replace")[-800:])
            try:
                with psycopg.connect(conninfo(self.url()), connect_timeout=2) as conn:
                    if conn.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                        return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise ConfigError(f"the standby did not accept connections in {START_BOUND_S:.0f} s")
            time.sleep(POLL_S)

    def sql(self, statement: str) -> list[tuple]:
        """One statement on the standby as the superuser; its rows."""
        with psycopg.connect(conninfo(self.url()), autocommit=True) as conn:
            cur = conn.execute(statement)
            return cur.fetchall() if cur.description else []

    def replayed(self, lsn: str) -> bool:
        return bool(self.sql(f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn")[0][0])

    def wait_replayed(self, bound_s: float = START_BOUND_S) -> float:
        """Until the standby has replayed everything the primary wrote up to now; the seconds it took."""
        with psycopg.connect(conninfo(self.primary.owner_url), autocommit=True) as conn:
            target = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]
        started = time.monotonic()
        while not self.replayed(target):
            if time.monotonic() - started > bound_s:
                raise ConfigError(f"the standby did not replay up to {target} in {bound_s:.0f} s")
            time.sleep(POLL_S)
        return time.monotonic() - started

    def kill(self) -> None:
        """SIGKILL the standby's processes (a node lost)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        (self.pgdata / "postmaster.pid").unlink(missing_ok=True)

    def stop(self) -> None:
        """A fast shutdown (SIGINT), then SIGKILL past 60 s."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.path, ignore_errors=True)
