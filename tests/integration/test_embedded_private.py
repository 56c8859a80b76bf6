"""The embedded PostgreSQL is private whatever the data-dir path: a 0700 socket directory of the
user that runs it, SCRAM passwords on the socket, no TCP, no directory widened, one owner that stops it."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import create_engine, pool, text
from sqlalchemy.engine import make_url

from kdbl_core.db.embedded_postgres import EmbeddedDatabase, as_server_user, pg_binary
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role

PROBE_USER = "kdbl-probe"


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _socket_dir(url: str) -> Path:
    return Path(make_url(url).query["host"])


@pytest.fixture
def private_parent(tmp_path_factory) -> Path:
    parent = tmp_path_factory.mktemp("private")
    parent.chmod(0o700)
    yield parent
    shutil.rmtree(parent, ignore_errors=True)


def _other_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(PROBE_USER)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", PROBE_USER],
                       check=True)
        return pwd.getpwnam(PROBE_USER)


def _connect_as(user: pwd.struct_passwd, socket_path: Path) -> subprocess.CompletedProcess:
    """Another local account tries the socket with the system Python (stdlib only)."""
    probe = textwrap.dedent(f"""
        import socket, sys
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({str(socket_path)!r})
        except OSError as exc:
            print(type(exc).__name__)
            sys.exit(3)
        print("connected")
    """)
    python = shutil.which("python3", path="/usr/bin:/bin:/usr/local/bin") or sys.executable
    return subprocess.run([python, "-c", probe], user=user.pw_uid, group=user.pw_gid, capture_output=True,
                          text=True, timeout=30, cwd="/")


def test_a_long_data_dir_path_keeps_the_server_private_and_its_parent_untouched(private_parent):
    data_dir = private_parent / ("long-" * 20) / "data"  # DIR/pgdata/.s.PGSQL.5432 exceeds 107 bytes
    assert len(str(data_dir / "pgdata" / ".s.PGSQL.5432")) > 107
    parent_before = private_parent.stat()
    with EmbeddedDatabase(data_dir) as db:
        socket_dir = _socket_dir(db.owner_url)
        info = socket_dir.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
        assert stat.S_IMODE((data_dir / "pg-password").stat().st_mode) == 0o600
        password = (data_dir / "pg-password").read_text().strip()
        assert password not in Path("/proc/self/cmdline").read_text()
        for pid in filter(str.isdigit, os.listdir("/proc")):  # not in any process's argv either
            try:
                assert password.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue

        # without the password, or with a wrong one, the socket refuses every role
        for user in ("postgres", "kdbl_api", "kdbl_worker"):
            for password_given in (None, "wrong"):
                with pytest.raises(psycopg.OperationalError, match="password"):
                    psycopg.connect(host=str(socket_dir), user=user, dbname="kdbl", password=password_given,
                                    connect_timeout=10).close()
        engine = create_engine(db.owner_url, poolclass=pool.NullPool)
        with engine.connect() as conn:
            assert conn.execute(text("SHOW listen_addresses")).scalar() == ""  # no TCP at all
            methods = {r.auth_method for r in conn.execute(text("SELECT auth_method FROM pg_hba_file_rules"))}
            assert methods == {"scram-sha-256"}
        engine.dispose()
        worker = create_engine(for_role(db.owner_url, "kdbl_worker"), poolclass=pool.NullPool)
        with worker.connect() as conn:
            assert conn.execute(text("SELECT current_user")).scalar() == "kdbl_worker"
        worker.dispose()

        if os.geteuid() == 0:  # another local account cannot even reach the socket
            probe = _connect_as(_other_user(), socket_dir / ".s.PGSQL.5432")
            assert probe.returncode == 3 and "PermissionError" in probe.stdout, probe
        else:
            assert not info.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    after = private_parent.stat()
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(parent_before.st_mode) == 0o700
    assert (after.st_uid, after.st_gid) == (parent_before.st_uid, parent_before.st_gid)
    assert not socket_dir.exists()  # the socket directory it made is gone with the server


def test_a_short_data_dir_keeps_the_socket_inside_the_0700_data_directory(private_parent):
    with EmbeddedDatabase(private_parent / "d") as db:
        socket_dir = _socket_dir(db.owner_url)
        assert socket_dir == (private_parent / "d" / "pgdata").resolve()
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(private_parent.stat().st_mode) == 0o700


def test_an_administration_command_attaches_to_the_owners_server_and_leaves_it_running(private_parent):
    data_dir = private_parent / "d"
    with EmbeddedDatabase(data_dir) as owner:
        with EmbeddedDatabase(data_dir, lock=False) as admin:
            assert not admin.owns_server and admin.owner_url == owner.owner_url
        engine = create_engine(owner.owner_url, poolclass=pool.NullPool)
        with engine.connect() as conn:  # still serving after the attached command ended
            assert conn.execute(text("SELECT 1")).scalar() == 1
        engine.dispose()
        pid = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
    assert not _running(pid)  # the owner stopped it


def test_a_server_left_by_a_killed_owner_is_stopped_and_replaced_with_a_message(private_parent, caplog):
    data_dir = private_parent / "d"
    script = ("import sys, pathlib; from kdbl_core.db.embedded_postgres import EmbeddedDatabase\n"
              f"db = EmbeddedDatabase(pathlib.Path({str(data_dir)!r})); db.start()\n"
              "print('ready', flush=True); sys.stdin.read()\n")
    owner = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert owner.stdout.readline().strip() == "ready"
        stale = int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
    finally:
        if owner.poll() is None:
            owner.kill()
    assert _running(stale)  # the crash left the server running
    with caplog.at_level("WARNING", logger="kdbl_core.db.embedded_postgres"), EmbeddedDatabase(data_dir) as db:
        assert db.stale_pid == stale
        assert not _running(stale)
        assert "left running by an earlier kdbl process" in caplog.text
        engine = create_engine(db.owner_url, poolclass=pool.NullPool)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM tenants")).scalar() >= 0
        engine.dispose()


def test_a_data_dir_from_an_earlier_release_with_trust_auth_gets_a_password(private_parent):
    from kdbl_core.db import embedded_postgres as embedded

    pgdata = private_parent / "d" / "pgdata"
    pgdata.mkdir(parents=True, mode=0o700)
    subprocess.run(embedded.as_server_user([embedded.pg_binary("initdb"), "-D", str(pgdata), "-U", "postgres",
                                             "--auth=trust", "--no-instructions"]),
                   check=True, capture_output=True)
    with EmbeddedDatabase(private_parent / "d") as db:
        socket_dir = _socket_dir(db.owner_url)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host=str(socket_dir), user="postgres", dbname="kdbl", connect_timeout=10).close()
        engine = create_engine(db.owner_url, poolclass=pool.NullPool)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_hba_file_rules WHERE auth_method = 'trust'")
                                ).scalar() == 0
        engine.dispose()


def test_a_restart_with_a_long_path_keeps_the_url_and_the_private_socket_directory(private_parent):
    db = EmbeddedDatabase(private_parent / ("long-" * 20) / "data")
    try:
        first = db.start()
        db.stop()
        assert not _socket_dir(first).exists()
        assert db.start() == first
        info = _socket_dir(first).stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.geteuid()
    finally:
        db.stop()


def test_pg_ctl_restart_brings_the_server_back_with_its_options_and_stop_ends_it(private_parent):
    """postmaster.opts is replayed through /bin/sh by `pg_ctl restart`: with `$libdir` and `$system` on the
    command line the restarted server lost them and did not come back. The options now live in a file."""
    db = EmbeddedDatabase(private_parent / "data")
    try:
        url = db.start()
        opts = (db.pgdata / "postmaster.opts").read_text()
        assert "$" not in opts and "-c" not in opts
        before = _postmaster_pid(db.pgdata)
        restart = as_server_user([pg_binary("pg_ctl"), "restart", "-D", str(db.pgdata), "-w", "-t", "300",
                                   "-m", "fast", "-l", str(db.pgdata / "log")])
        result = subprocess.run(restart, capture_output=True, text=True, timeout=600, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        after = _postmaster_pid(db.pgdata)
        assert after != before
        with psycopg.connect(conninfo(url), autocommit=True) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
            assert conn.execute("SHOW unix_socket_permissions").fetchone() == ("0700",)
            assert "pg_prewarm" in conn.execute("SHOW shared_preload_libraries").fetchone()[0]
            [libs] = conn.execute("SHOW dynamic_library_path").fetchone()
            assert libs.startswith("$libdir:") and libs != "$libdir:"
            assert conn.execute("SELECT count(*) FROM pg_available_extensions WHERE name = 'kdbl_bm25'"
                                ).fetchone() == (1,)
        db.stop()
        assert not _running(after)
    finally:
        db.stop()


def _postmaster_pid(pgdata: Path) -> int:
    return int((pgdata / "postmaster.pid").read_text().split()[0])
