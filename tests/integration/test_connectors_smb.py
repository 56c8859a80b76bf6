"""The smb connector against a real Samba server on loopback.

.ci/install-samba.sh installs Debian's samba when smbd is missing (the module skips, saying why, when it
cannot). The module starts its own smbd on a free loopback port with every state folder and a tdbsam password
database under a temporary folder, and a dedicated unix account (`kdbl-smb-test`, created when missing) that
the share's files are served as: smbd must run as root for that, and because that account is not root, a
folder with mode 000 is really unreadable to the connector.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import db_of, free_port
from kdbl_control import admin
from kdbl_control.cli import build_parser
from kdbl_control.cli_source import source_config
from kdbl_core.errors import InvalidArgument, PermanentError
from kdbl_core.settings import Settings
from kdbl_core.sources import parse
from kdbl_worker.connectors import OutsideSource, SourceUnavailable, connector_for
from kdbl_worker.connectors.smb import SmbConnector
from kdbl_worker.pipeline import Indexer, load_sources
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / ".ci" / "install-samba.sh"
UNIX_USER, PASSWORD = "kdbl-smb-test", "correct horse battery staple"
ENV = {"username": "KDBL_TEST_SMB_USER", "password": "KDBL_TEST_SMB_PASSWORD"}
FILES: dict[str, bytes] = {
    "readme.txt": b"top level readme",
    "docs/guide.md": b"# Guide\n\nInstall the widget.",
    "docs/deep/er/nested.txt": b"three levels down",
    "sp ace/na%me #1.txt": b"odd name survives",
    "\u00fcn\u00ef/\u6587\u6863 \u00e9t\u00e9.md": "unicode \u6587\u6863".encode(),
    "plus+&=;,'.txt": b"reserved characters",
    "per%2Fcent%25.txt": b"percent escapes stay literal",
    "empty.txt": b"",
    "big.bin": os.urandom(2 * 1024 * 1024 + 7),
}
EMPTY_DIRS = ["hollow", "docs/hollow too"]
QUESTION = "what?.txt"  # SMB cannot carry a '?': Samba serves it under a mangled 8.3 name


@dataclass
class Samba:
    port: int
    share: Path  # the shared folder on disk
    pid: int
    links: Path  # the folder shared as [links] (Samba's defaults) and [links-strict] (follow symlinks = no)


def global_section(state: Path, *, port: int, interfaces: str) -> str:
    """smb.conf's [global] for a test server: every state folder under `state`, a tdbsam password
    database, no printing, no guest, listening on `interfaces` (bound to them alone) at `port`."""
    return f"""[global]
  server role = standalone server
  smb ports = {port}
  interfaces = {interfaces}
  bind interfaces only = yes
  private dir = {state}/private
  lock directory = {state}/lock
  state directory = {state}/state
  cache directory = {state}/cache
  pid directory = {state}/pid
  ncalrpc dir = {state}/ncalrpc
  binddns dir = {state}/binddns
  passdb backend = tdbsam:{state}/private/passdb.tdb
  log file = {state}/smbd.log
  log level = 1
  load printers = no
  printing = bsd
  printcap name = /dev/null
  disable spoolss = yes
  map to guest = Never
  usershare path =
"""


def _run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=900, check=False)


def _smb_user() -> None:
    """The unix account Samba serves the share as (idempotent)."""
    try:
        pwd.getpwnam(UNIX_USER)
    except KeyError:
        proc = _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", UNIX_USER)
        if proc.returncode not in (0, 9):  # 9: created meanwhile by another run
            pytest.skip(f"cannot create the unix user {UNIX_USER} for Samba: {proc.stderr.strip()}")


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"smbd exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"smbd did not listen on {port} within 30 s")


@pytest.fixture(scope="module")
def samba() -> Iterator[Samba]:
    if os.geteuid() != 0:
        pytest.skip("smbd must run as root to serve the share as a separate unix user")
    proc = _run("bash", str(INSTALL))
    if proc.returncode != 0:
        pytest.skip(f"Samba is not installed and {INSTALL.name} could not install it (no package mirror?): "
                    f"{(proc.stdout + proc.stderr).strip()[-500:]}")
    _smb_user()
    smbd = shutil.which("smbd") or "/usr/sbin/smbd"
    smbpasswd = shutil.which("smbpasswd") or "/usr/bin/smbpasswd"
    top = Path(tempfile.mkdtemp(prefix="kdbl-smb-"))  # not pytest's tmp root: 0700, closed to the user
    top.chmod(0o755)
    share, state, links = top / "share", top / "state", top / "links" / "share"
    share.mkdir(mode=0o755)
    links.mkdir(mode=0o755, parents=True)
    for name in ("private", "lock", "state", "cache", "pid", "ncalrpc", "binddns"):
        (state / name).mkdir(parents=True)
    port = free_port()
    conf = top / "smb.conf"
    conf.write_text(global_section(state, port=port, interfaces="127.0.0.1") + f"""[docs]
  path = {share}
  read only = yes
  valid users = {UNIX_USER}
[links]
  path = {links}
  read only = yes
  valid users = {UNIX_USER}
[links-strict]
  path = {links}
  read only = yes
  valid users = {UNIX_USER}
  follow symlinks = no
[links-dfs]
  path = {links}
  read only = yes
  valid users = {UNIX_USER}
  msdfs root = yes
""")
    added = _run(smbpasswd, "-c", str(conf), "-a", "-s", UNIX_USER, stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert added.returncode == 0, added.stderr
    log = state / "smbd.out"
    with open(log, "wb") as out:
        # A session of its own: smbd signals its whole process group when it stops; not pytest's, please.
        server = subprocess.Popen([smbd, "--foreground", "--no-process-group", f"--configfile={conf}"],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_port(port, server, log)
        yield Samba(port, share, server.pid, links)
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)
        for folder, dirs, _ in os.walk(top):  # let rmtree into the locked folder
            for path in (os.path.join(folder, d) for d in dirs):
                if not os.path.islink(path):
                    os.chmod(path, 0o755)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def smb_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV["username"], UNIX_USER)
        mp.setenv(ENV["password"], PASSWORD)
        yield


@pytest.fixture(scope="module")
def tree(samba) -> Path:
    """share/tree: the well-behaved files; share/trouble: a locked folder, a symlink loop, a "?" name."""
    base = samba.share / "tree"
    for key, body in FILES.items():
        path = base / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    for folder in EMPTY_DIRS:
        (base / folder).mkdir(parents=True)
    trouble = samba.share / "trouble"
    (trouble / "locked").mkdir(parents=True)
    (trouble / "locked" / "secret.txt").write_text("not for the crawler")
    (trouble / "locked").chmod(0)
    (trouble / "open.txt").write_text("readable")
    (trouble / "loop").symlink_to(".")
    (trouble / QUESTION).write_bytes(b"question mark")
    return base


def connect(samba: Samba, **extra) -> SmbConnector:
    config = {"server": "127.0.0.1", "port": samba.port, "share": "docs", "credentials": {"env": ENV},
              "base_delay": 0.01, **extra}
    connector = connector_for("smb", config)
    assert isinstance(connector, SmbConnector)
    return connector


def _mtime(path: Path) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=path.stat().st_mtime_ns // 1000)


def _connections(samba: Samba) -> dict[str, int]:
    """Established connections to the server: socket inode -> pid of the smbd serving it. (Samba may serve
    several connections in one process, so processes are no measure of connections.)"""
    port = f":{samba.port:04X}"
    inodes = {f[9] for f in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
              if f[1].endswith(port) and f[3] == "01"}
    children = subprocess.run(["pgrep", "-P", str(samba.pid)], capture_output=True, text=True,
                              check=False).stdout.split()
    out = {}
    for pid in children:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # exited meanwhile
            continue
        out.update({link[8:-1]: int(pid) for link in links if link[8:-1] in inodes})
    return out


# -- listing and reading -------------------------------------------------------------------------------------


def test_walk_lists_nested_files_with_size_and_mtime(samba, tree):
    with connect(samba, path="tree") as connector:
        files = {f.key: f for f in connector.walk()}
    assert {k: (f.size, f.mtime) for k, f in files.items()} == {
        key: (len(body), _mtime(tree / key)) for key, body in FILES.items()}
    assert all(f.etag is None and f.owner is None for f in files.values())
    assert not connector.problems.items


def test_a_sub_folder_is_a_base_too_with_either_separator(samba, tree):
    for path in ("tree/sp ace", "/tree\\sp ace/"):
        with connect(samba, path=path) as connector:
            assert [f.key for f in connector.walk()] == ["na%me #1.txt"]
            with connector.open("na%me #1.txt") as stream:
                assert stream.read() == b"odd name survives"


def test_open_round_trips_every_name(samba, tree):
    with connect(samba, path="tree") as connector:
        for key, body in FILES.items():
            with connector.open(key) as stream:
                assert stream.read() == body, key
        with pytest.raises(FileNotFoundError):
            connector.open("docs/missing.txt")
        with pytest.raises(FileNotFoundError):
            connector.open("../trouble/open.txt")


def test_open_streams_instead_of_reading_the_whole_file(samba, tree):
    body = os.urandom(32 * 1024 * 1024)
    (tree / "huge.bin").write_bytes(body)
    digest = hashlib.sha256()
    try:
        with connect(samba, path="tree") as connector:
            tracemalloc.start()
            try:
                with connector.open("huge.bin") as stream:
                    while chunk := stream.read(256 * 1024):
                        digest.update(chunk)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
    finally:
        (tree / "huge.bin").unlink()
    assert digest.digest() == hashlib.sha256(body).digest()
    # About 7 MiB: smbprotocol copies each 1 MiB read a few times on its way; never the whole file.
    assert peak < len(body) // 2, f"peak {peak} bytes for a 32 MiB file"


def test_a_name_smb_cannot_carry_arrives_mangled_and_still_reads(samba, tree):
    with connect(samba, path="trouble") as connector:
        keys = [f.key for f in connector.walk()]
        [mangled] = [k for k in keys if k not in ("open.txt",)]
        assert "?" not in mangled and "~" in mangled
        with connector.open(mangled) as stream:
            assert stream.read() == b"question mark"


def test_an_unreadable_folder_and_a_folder_loop_are_problems_not_failures(samba, tree):
    with connect(samba, path="trouble") as connector:
        keys = {f.key for f in connector.walk()}
        assert "open.txt" in keys and not any(k.startswith(("locked/", "loop/")) for k in keys)
        problems = dict(connector.problems.items)
        assert problems.keys() == {"locked", "loop"}
        assert "access denied" in problems["locked"] and "loop" in problems["loop"]
        with pytest.raises(PermissionError):
            connector.open("locked/secret.txt")
    with connect(samba) as connector:  # the share root: the clean tree and the trouble, side by side
        keys = {f.key for f in connector.walk()}
        assert {f"tree/{k}" for k in FILES} <= keys and "trouble/open.txt" in keys
        assert dict(connector.problems.items).keys() == {"trouble/locked", "trouble/loop"}


@pytest.fixture(scope="module")
def linked(samba, tree) -> Path:
    """links/share (shared three ways, see the samba fixture) beside links/outside, which is not shared:
    links out of the share, links inside it but out of the folder `team`, and an MS-DFS link to [docs]."""
    share, outside = samba.links, samba.links.parent / "outside"
    outside.mkdir(mode=0o755)
    (outside / "secret.txt").write_text("outside the share: never indexed")
    (share / "real.txt").write_text("real")
    for folder in ("team", "hr"):
        (share / folder).mkdir()
    (share / "team" / "doc.txt").write_text("team doc")
    (share / "hr" / "salaries.txt").write_text("hr salaries")
    (share / "out-passwd.txt").symlink_to("/etc/passwd")
    (share / "out-secret.txt").symlink_to(outside / "secret.txt")
    (share / "out-dir").symlink_to(outside, target_is_directory=True)
    (share / "team" / "hr-link.txt").symlink_to("../hr/salaries.txt")
    (share / "team" / "hr-dir").symlink_to("../hr", target_is_directory=True)
    (share / "dfs-docs").symlink_to("msdfs:127.0.0.1\\docs")  # Samba's form of a DFS link (msdfs root)
    return share


def _listing(samba, **extra) -> tuple[set[str], dict[str, str]]:
    with connect(samba, **extra) as connector:
        return {f.key for f in connector.walk()}, dict(connector.problems.items)


def test_samba_never_shows_or_opens_a_link_that_leaves_the_share(samba, linked):
    keys, _ = _listing(samba, share="links")  # Samba's defaults: follow symlinks = yes, wide links = no
    assert keys == {"real.txt", "hr/salaries.txt", "team/doc.txt", "team/hr-link.txt"}
    with connect(samba, share="links") as connector:
        for key in ("out-passwd.txt", "out-secret.txt", "out-dir/secret.txt"):
            with pytest.raises(FileNotFoundError):
                connector.open(key)


def test_with_samba_defaults_a_link_inside_the_share_arrives_as_a_plain_file_even_out_of_the_source_path(
        samba, linked):
    """The limit the connector cannot close: Samba follows the link itself and shows its target as a
    plain file (no reparse point), so a source on `team` reads hr/ through team's links. `follow
    symlinks = no` on the share is the fix (next test); docs/operations say so."""
    keys, problems = _listing(samba, share="links", path="team")
    assert keys == {"doc.txt", "hr-link.txt", "hr-dir/salaries.txt"} and not problems


def test_with_follow_symlinks_off_samba_shows_no_link_at_all(samba, linked):
    keys, problems = _listing(samba, share="links-strict", path="team")
    assert keys == {"doc.txt"} and not problems
    keys, _ = _listing(samba, share="links-strict")
    assert keys == {"real.txt", "hr/salaries.txt", "team/doc.txt"}


def test_a_dfs_link_to_another_share_is_skipped_in_the_listing_and_refused_at_the_open(samba, linked):
    """An MS-DFS link is a reparse point to the client, and smbclient would follow its referral to the other
    share: the listing records it skipped, and a key through it (a folder swapped for one after indexing)
    is refused once the handle shows another share."""
    (samba.share / "dfs-target.txt").write_text("in the docs share, not in this source")
    try:
        keys, problems = _listing(samba, share="links-dfs")
        assert keys == {"real.txt", "hr/salaries.txt", "team/doc.txt", "team/hr-link.txt"}
        assert problems["dfs-docs"] == "reparse point (a symbolic link, junction or DFS link) not followed; skipped"
        with connect(samba, share="links-dfs") as connector, pytest.raises(OutsideSource, match="DFS link"):
            connector.open("dfs-docs/dfs-target.txt")
    finally:
        (samba.share / "dfs-target.txt").unlink()


def test_a_connection_that_breaks_mid_file_goes_on_where_it_stopped(samba, tree):
    with connect(samba, path="tree") as connector, connector.open("big.bin") as stream:
        head = stream.read(1024 * 1024 + 3)
        serving = set(_connections(samba).values())
        assert serving
        for pid in serving:  # the smbd serving this connector: the connection breaks
            os.kill(pid, 9)
        assert head + stream.read() == FILES["big.bin"]


def test_a_file_that_changed_while_the_connection_was_down_is_not_spliced(samba, tree):
    path = tree / "changing.bin"
    path.write_bytes(b"a" * (3 * 1024 * 1024))
    try:
        with connect(samba, path="tree") as connector, connector.open("changing.bin") as stream:
            stream.read(1024 * 1024)
            path.write_bytes(b"b" * (3 * 1024 * 1024 + 1))
            for pid in set(_connections(samba).values()):
                os.kill(pid, 9)
            with pytest.raises(OSError, match="changed while it was read"):
                stream.read()
    finally:
        path.unlink()


def test_each_connector_has_its_own_session_and_close_ends_it(samba, tree):
    before = set(_connections(samba))
    first, second = connect(samba, path="tree"), connect(samba, path="tree")
    first.check()
    second.check()
    assert len(set(_connections(samba)) - before) == 2
    first.close()
    deadline = time.monotonic() + 10
    while len(set(_connections(samba)) - before) != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(set(_connections(samba)) - before) == 1
    second.check()  # untouched by the other connector's close
    second.close()
    first.check()  # a closed connector connects again when used
    first.close()


# -- failures of the share as a whole ------------------------------------------------------------------------


def test_wrong_password_is_source_unavailable_and_never_shows_the_password(samba, tree, monkeypatch, caplog):
    monkeypatch.setenv("KDBL_TEST_SMB_WRONG", "not the password")
    caplog.set_level(logging.DEBUG)
    with (connect(samba, credentials={"env": {**ENV, "password": "KDBL_TEST_SMB_WRONG"}}) as connector,
          pytest.raises(SourceUnavailable, match=r"authentication failed.*STATUS_LOGON_FAILURE") as err):
        list(connector.walk())
    for shown in (str(err.value), caplog.text):
        assert "not the password" not in shown and PASSWORD not in shown


def test_credentials_from_a_mounted_secret_dir_with_a_domain(samba, tree, tmp_path):
    (tmp_path / "username").write_text(UNIX_USER + "\n")
    (tmp_path / "password").write_text(PASSWORD)
    (tmp_path / "domain").write_text("WORKGROUP")
    with connect(samba, credentials={"dir": str(tmp_path)}) as connector:
        connector.check()
    (tmp_path / "password").unlink()
    with pytest.raises(PermanentError, match="missing password"):
        connect(samba, credentials={"dir": str(tmp_path)}).check()


def test_unreachable_server_is_source_unavailable_after_retries(caplog):
    config = {"server": "127.0.0.1", "port": free_port(), "share": "docs", "credentials": {"env": ENV},
              "max_attempts": 3, "base_delay": 0.01, "connect_timeout": 2}
    with (connector_for("smb", config) as connector,
          pytest.raises(SourceUnavailable, match=r"cannot reach the server.*3 attempts")):
        connector.check()
    assert sum("retrying" in r.getMessage() for r in caplog.records) == 2


@pytest.mark.parametrize("extra, message", [
    ({"share": "nosuch"}, "no such share"),
    ({"path": "tree/nothing-here"}, "no such file or folder"),
    ({"path": "tree/readme.txt"}, "not a folder"),
    ({"path": "trouble/locked"}, "access denied"),
])
def test_a_missing_or_unusable_base_is_source_unavailable(samba, tree, extra, message):
    with connect(samba, **extra) as connector:
        with pytest.raises(SourceUnavailable, match=message):
            connector.check()
        with pytest.raises(SourceUnavailable, match=message):
            list(connector.walk())


def test_config_is_validated_and_names_the_field():
    base = {"server": "fs1", "share": "docs", "credentials": {"env": ENV}}
    for bad, field in [({"server": "//fs1/docs"}, "server"), ({"server": "bob@fs1"}, "server"),
                       ({"share": "a/b"}, "share"), ({"share": ""}, "share"),
                       ({"path": "a/../../etc"}, "path"), ({"port": 0}, "port"), ({"port": "445"}, "port"),
                       ({"max_attempts": 0}, "max_attempts"), ({"credentials": None}, "credentials")]:
        with pytest.raises(InvalidArgument) as err:
            connector_for("smb", {**base, **bad})
        assert err.value.field == field, bad
    with pytest.raises(InvalidArgument, match="credentials") as err:
        connector_for("smb", {**base, "credentials": {"password": "hunter2"}})
    assert "hunter2" not in str(err.value)


def test_the_config_the_operator_writes_is_what_the_connector_reads():
    from kdbl_operator.desired import connection_config

    config = connection_config("smb", {"server": "fs1.corp", "share": "docs", "path": "/team/handbook",
                                       "domain": "CORP", "port": 4450})
    parsed = parse("smb", {**config, "credentials": {"dir": "/var/run/secrets/kdbl/sources/ns/fs1"}})
    assert (parsed.server, parsed.share, parsed.path, parsed.port, parsed.domain) == (
        "fs1.corp", "docs", ("team", "handbook"), 4450, "CORP")


def test_control_cli_builds_an_smb_source_config():
    args = build_parser().parse_args([
        "source", "add", "--tenant", "t", "--protocol", "smb", "--server", "fs1.corp", "--share", "docs",
        "--path", "team/handbook", "--port", "4450", "--domain", "CORP",
        "--credentials-env", "username=SMB_USER,password=SMB_PASSWORD", "--exclude", "*.tmp"])
    assert source_config(args) == {
        "server": "fs1.corp", "share": "docs", "path": "team/handbook", "port": 4450, "domain": "CORP",
        "credentials": {"env": {"username": "SMB_USER", "password": "SMB_PASSWORD"}}, "exclude": ["*.tmp"]}
    with pytest.raises(InvalidArgument) as err:
        source_config(build_parser().parse_args(["source", "add", "--tenant", "t", "--protocol", "smb",
                                                 "--server", "fs1"]))
    assert err.value.field == "share"


# -- end to end: the real pipeline and the real database -----------------------------------------------------


def test_crawl_an_smb_source_end_to_end(owner_engine, worker_engine, unique, samba, tree):
    folder = samba.share / f"e2e-{unique}"
    (folder / "notes").mkdir(parents=True)
    (folder / "guide.md").write_text("# Guide\n\nInstall the widget.")
    (folder / "notes" / "plan #1.txt").write_text("quarterly plan")
    (folder / "notes" / "scratch.tmp").write_text("excluded by a glob")
    tenant = f"smb-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="smb", name=f"smb-{unique}", config={
        "server": "127.0.0.1", "port": samba.port, "share": "docs", "path": f"e2e-{unique}",
        "credentials": {"env": ENV}, "exclude": ["*.tmp"]})
    indexer = Indexer(db_of(worker_engine), Settings())

    def crawl():
        [row] = load_sources(db_of(worker_engine), source_id=source.id)
        return indexer.crawl(row)

    def rows():
        with owner_engine.connect() as conn:
            return {r.key: r for r in conn.execute(text(
                "SELECT f.key, f.status, f.size, f.mtime, (SELECT string_agg(c.text, ' ') FROM chunks c "
                "WHERE c.file_id = f.id) AS body FROM files f WHERE f.source_id = :s"), {"s": source.id})}

    stats = crawl()
    assert (stats.listed, stats.indexed, stats.failed) == (2, 2, 0)
    files = rows()
    assert set(files) == {"guide.md", "notes/plan #1.txt"} and all(f.status == "ok" for f in files.values())
    assert files["guide.md"].mtime == _mtime(folder / "guide.md") and files["guide.md"].size == 28
    assert "quarterly plan" in files["notes/plan #1.txt"].body
    assert crawl().indexed == 0
    (folder / "notes" / "plan #1.txt").write_text("revised quarterly plan")
    stats = crawl()
    assert (stats.indexed, stats.unchanged) == (1, 1)
    assert "revised" in rows()["notes/plan #1.txt"].body
    (folder / "guide.md").unlink()
    assert crawl().deleted == 1
    assert set(rows()) == {"notes/plan #1.txt"}
