"""Permissions from the share (issue 30): the smb connector lists each file with its security descriptor, read
from a real Samba server and checked against Samba's own `smbcacls --numeric`.

The module starts its own smbd (the helpers of test_connectors_smb.py: .ci/install-samba.sh, the unix
account) on port 445 of a random loopback address (127.x.y.z): smbcacls has no port option and always dials
445, and an address of its own leaves the port free elsewhere. `vfs objects = acl_xattr`: Samba keeps each
file's NT ACL in its `security.NTACL` extended attribute (hence root, and a file system with xattrs), and
`ignore system acls` stores any SID without mapping it to a POSIX ACL. Two shares on the same folder:
[acls], read-only, for the connector; [acls-rw], where `smbcacls` sets the ACLs and the `smbclient` tool
creates files that inherit a folder's entries. The account owns the files, so it may read and change every
descriptor (an owner's implicit READ_CONTROL and WRITE_DAC) except where an OWNER RIGHTS entry takes that
away.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import re
import shutil
import socket
import subprocess
import uuid
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kdbl_core.access.share_acl import INHERITED, Ace, FileAccess, NtAccess
from kdbl_worker.connectors import connector_for
from kdbl_worker.connectors.smb import SmbConnector, parse_security_descriptor
from test_connectors_smb import ENV, INSTALL, PASSWORD, UNIX_USER, _run, _smb_user, global_section

EVERYONE_SID = "S-1-1-0"
OWNER_RIGHTS = "S-1-3-4"
OTHER_USER = "S-1-5-21-1004336348-1177238915-682003330-1104"  # a domain user's SID: stored, never resolved
GROUP = "S-1-5-21-1004336348-1177238915-682003330-513"  # that domain's Domain Users
DENIED_USER = "S-1-5-21-1004336348-1177238915-682003330-1105"
READ, FULL, FILE_READ_DATA = 0x001200A9, 0x001F01FF, 0x00000001
OI_CI = 0x03


@dataclass
class AclSamba:
    host: str  # a loopback address of its own; the port is 445
    root: Path  # the folder both shares serve
    conf: Path  # its smb.conf
    owner: str  # the SID Samba gives the unix account that owns the files


def _conf(top: Path, host: str) -> Path:
    """`interfaces` names the address with a netmask: alone, smbd looks for an interface that has it (lo has
    only 127.0.0.1) and binds nothing."""
    state = top / "state"
    for name in ("private", "lock", "state", "cache", "pid", "ncalrpc", "binddns"):
        (state / name).mkdir(parents=True)
    share = f"""  path = {top / "share"}
  valid users = {UNIX_USER}
  vfs objects = acl_xattr
  acl_xattr:ignore system acls = yes
"""
    conf = top / "smb.conf"
    conf.write_text(global_section(state, port=445, interfaces=f"{host}/8") + f"""[acls]
{share}  read only = yes
[acls-rw]
{share}  read only = no
""")
    return conf


def _xattrs_work(folder: Path) -> bool:
    probe = folder / ".xattr-probe"
    probe.touch()
    try:
        os.setxattr(probe, "security.kdbl-probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def _free_loopback() -> str:
    """A 127.x.y.z nobody listens on at port 445 (all of 127/8 is the loopback interface on Linux)."""
    for _ in range(20):
        host = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
        with socket.socket() as sock:
            try:
                sock.bind((host, 445))
                return host
            except OSError:
                continue
    pytest.skip("no loopback address with a free port 445 (a system smbd listening on all addresses?)")


def _wait_for_smbd(host: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"smbd exited ({proc.returncode}): {log.read_text(errors='replace')[-2000:]}")
        try:
            socket.create_connection((host, 445), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"smbd did not listen on {host}:445 within 30 s")


@contextlib.contextmanager
def serving_acls() -> Iterator[AclSamba]:
    """smbd with the [acls] and [acls-rw] shares on a free loopback address, stopped and cleaned up after."""
    proc = _run("bash", str(INSTALL))
    if proc.returncode != 0:
        pytest.skip(f"Samba and smbcacls are not installed and {INSTALL.name} could not install them: "
                    f"{(proc.stdout + proc.stderr).strip()[-500:]}")
    _smb_user()
    top = Path(tempfile.mkdtemp(prefix="kdbl-smbacl-"))
    top.chmod(0o755)
    root = top / "share"
    root.mkdir(mode=0o755)
    if not _xattrs_work(root):
        shutil.rmtree(top)
        pytest.skip(f"{top} has no security.* extended attributes: Samba's acl_xattr cannot keep NT ACLs")
    os.chown(root, *_ids())
    host = _free_loopback()
    conf = _conf(top, host)
    smbpasswd = shutil.which("smbpasswd") or "/usr/bin/smbpasswd"
    added = _run(smbpasswd, "-c", str(conf), "-a", "-s", UNIX_USER, stdin=f"{PASSWORD}\n{PASSWORD}\n")
    assert added.returncode == 0, added.stderr
    log = top / "state" / "smbd.out"
    with open(log, "wb") as out:
        server = subprocess.Popen([shutil.which("smbd") or "/usr/sbin/smbd", "--foreground",
                                   "--no-process-group", f"--configfile={conf}"],
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_smbd(host, server, log)
        samba = AclSamba(host, root, conf, owner="")
        samba.owner = descriptor(samba, "").owner or ""
        assert samba.owner.startswith("S-1-"), samba.owner
        yield samba
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def acl_samba() -> Iterator[AclSamba]:
    if os.geteuid() != 0:
        pytest.skip("smbd must run as root to serve the share as a separate unix user and keep NTACL xattrs")
    with serving_acls() as samba:
        yield samba


@pytest.fixture(scope="module", autouse=True)
def smb_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV["username"], UNIX_USER)
        mp.setenv(ENV["password"], PASSWORD)
        yield


def _ids() -> tuple[int, int]:
    entry = pwd.getpwnam(UNIX_USER)
    return entry.pw_uid, entry.pw_gid


def _client(samba: AclSamba, tool: str, *argv: str) -> str:
    """Samba's own command-line clients against [acls-rw], as the account."""
    proc = _run(shutil.which(tool) or f"/usr/bin/{tool}", f"//{samba.host}/acls-rw",
                f"--configfile={samba.conf}", "-U", f"{UNIX_USER}%{PASSWORD}", *argv)
    assert proc.returncode == 0, f"{tool} {argv}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def smbcacls(samba: AclSamba, key: str, *argv: str) -> str:
    return _client(samba, "smbcacls", key.replace("/", "\\"), *argv)


_ACE_LINE = re.compile(r"^ACL:(S-[0-9-]+):(\d+)/(0x[0-9a-f]+)/(0x[0-9a-f]+)$")


def descriptor(samba: AclSamba, key: str) -> NtAccess:
    """What `smbcacls --numeric` prints for `key`: the owner and the DACL's entries, as share_acl's types."""
    owner, aces = None, []
    for line in smbcacls(samba, key, "--numeric").splitlines():
        if line.startswith("OWNER:"):
            owner = line[len("OWNER:"):]
        elif line.startswith("ACL:"):
            match = _ACE_LINE.match(line)
            assert match, line
            sid, kind, flags, mask = match.groups()
            assert kind in ("0", "1"), line  # allowed / denied: all these tests set
            aces.append(Ace(sid=sid, allow=kind == "0", mask=int(mask, 16), flags=int(flags, 16)))
    return NtAccess(owner=owner, dacl=tuple(aces))


def _file(samba: AclSamba, key: str, body: bytes = b"text") -> Path:
    path = samba.root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(body)
    uid, gid = _ids()
    for part in (path, *path.relative_to(samba.root).parents):
        os.chown(samba.root / part, uid, gid)
    return path


def connect(samba: AclSamba, **extra) -> SmbConnector:
    connector = connector_for("smb", {"server": samba.host, "share": "acls",
                                      "credentials": {"env": ENV}, "base_delay": 0.01, **extra})
    assert isinstance(connector, SmbConnector)
    return connector


def listing(samba: AclSamba, path: str, **walk) -> tuple[dict[str, object], dict[str, str]]:
    with connect(samba, path=path) as connector:
        files = {f.key: f for f in connector.walk(**walk)}
    return files, dict(connector.problems.items)


def _ace(sid: str, mask: int, *, allow: bool = True, flags: int = 0) -> str:
    return f"ACL:{sid}:{'ALLOWED' if allow else 'DENIED'}/0x{flags:x}/0x{mask:08x}"


def smbclient_put(samba: AclSamba, key: str, body: bytes, scratch: Path) -> None:
    """A file created through the server, so Samba gives it the entries its folder passes on."""
    local = scratch / "upload"
    local.write_bytes(body)
    _client(samba, "smbclient", "-c", f'put "{local}" "{key.replace("/", chr(92))}"')


EXPLICIT = {  # file -> the DACL smbcacls sets (owner, a user, a group, a deny, Everyone)
    "explicit.txt": lambda owner: [_ace(owner, FULL), _ace(OTHER_USER, READ), _ace(GROUP, READ),
                                   _ace(DENIED_USER, FILE_READ_DATA, allow=False), _ace(EVERYONE_SID, READ)],
    "everyone.txt": lambda owner: [_ace(EVERYONE_SID, READ)],
    "denied.txt": lambda owner: [_ace(EVERYONE_SID, READ), _ace(GROUP, FULL, allow=False)],
}


@pytest.fixture(scope="module")
def tree(acl_samba) -> Path:
    """tree/: files with explicit ACLs, tree/inherit/ (entries from the folder), tree/many/ (more files than
    the connector keeps in flight, each with an entry of its own), tree/locked.txt (unreadable descriptor)."""
    samba, base = acl_samba, acl_samba.root / "tree"
    for name, entries in EXPLICIT.items():
        _file(samba, f"tree/{name}")
        smbcacls(samba, f"tree/{name}", "--set", ",".join(entries(samba.owner)))
    # Windows' way: entries added to the folder and propagated to what is in it (marked INHERITED there)
    _file(samba, "tree/inherit/child.txt", b"inherits its folder's entries")
    smbcacls(samba, "tree/inherit", "--propagate-inheritance", "--add", ",".join([
        _ace(OTHER_USER, READ, flags=OI_CI), _ace(DENIED_USER, FILE_READ_DATA, allow=False, flags=OI_CI)]))
    # a file created through the server later gets them too
    smbclient_put(samba, "tree/inherit/later.txt", b"created after", samba.root.parent)
    for i in range(40):
        _file(samba, f"tree/many/{i:02d}.txt", f"file {i}".encode())
        smbcacls(samba, f"tree/many/{i:02d}.txt", "--add", _ace(f"S-1-5-21-1-2-3-{2000 + i}", READ))
    # OWNER RIGHTS takes the owner's implicit READ_CONTROL away and grants only FILE_READ_ATTRIBUTES
    _file(samba, "tree/locked.txt")
    smbcacls(samba, "tree/locked.txt", "--set", _ace(OWNER_RIGHTS, 0x80))
    return base


def _messages(connector: SmbConnector) -> int:
    """SMB messages sent so far on the connector's connections (each takes a message id, one credit here)."""
    return sum(c.sequence_window["low"] for c in connector._pool.values())


def test_walk_without_access_reads_no_descriptors(acl_samba, tree):
    with connect(acl_samba, path="tree") as connector:
        files = list(connector.walk())
        plain = _messages(connector)
    assert len(files) == 3 + 2 + 40 + 1 and not connector.problems.items
    assert all(f.access is None for f in files)
    with connect(acl_samba, path="tree") as connector:
        assert len(list(connector.walk(access=True))) == len(files)
        with_access = _messages(connector)
    assert plain < len(files)  # logon, the base folder and three folder listings
    # one CREATE + QUERY_INFO + CLOSE compound per file, and an ECHO or so asking for credits
    assert 3 * len(files) <= with_access - plain <= 3 * len(files) + 2


def test_every_descriptor_equals_what_smbcacls_numeric_prints(acl_samba, tree):
    files, problems = listing(acl_samba, "tree", access=True)
    assert problems.keys() == {"locked.txt"}
    for key, meta in files.items():
        if key != "locked.txt":
            assert meta.access == FileAccess(nt=descriptor(acl_samba, f"tree/{key}")), key


def test_explicit_allow_deny_and_everyone_entries(acl_samba, tree):
    files, _ = listing(acl_samba, "tree", access=True)
    owner = acl_samba.owner
    explicit = files["explicit.txt"].access.nt
    assert explicit.owner == owner
    assert set(explicit.dacl) == {
        Ace(owner, True, FULL, 0), Ace(OTHER_USER, True, READ, 0), Ace(GROUP, True, READ, 0),
        Ace(DENIED_USER, False, FILE_READ_DATA, 0), Ace(EVERYONE_SID, True, READ, 0)}
    assert files["everyone.txt"].access.nt == NtAccess(owner, (Ace(EVERYONE_SID, True, READ, 0),))
    denied = files["denied.txt"].access.nt.dacl
    assert denied[0] == Ace(GROUP, False, FULL, 0)  # canonical order: the deny first
    assert Ace(EVERYONE_SID, True, READ, 0) in denied


def test_a_file_gets_its_folders_inheritable_entries_flagged_inherited(acl_samba, tree):
    files, problems = listing(acl_samba, "tree/inherit", access=True)
    assert files.keys() == {"child.txt", "later.txt"} and not problems
    child = files["child.txt"].access.nt
    assert child.owner == acl_samba.owner
    inherited = [a for a in child.dacl if a.flags & INHERITED]
    assert inherited == [Ace(DENIED_USER, False, FILE_READ_DATA, INHERITED),
                         Ace(OTHER_USER, True, READ, INHERITED)]
    assert child.dacl[-2:] == tuple(inherited)  # after the file's own entries, the deny too
    # Samba marks entries it copies at creation INHERITED only under an auto-inherited folder DACL (a
    # control bit smbcacls cannot set); the entries themselves arrive
    later = files["later.txt"].access.nt
    assert {(a.sid, a.allow, a.mask) for a in later.dacl} == {
        (DENIED_USER, False, FILE_READ_DATA), (OTHER_USER, True, READ)}


def test_more_files_than_in_flight_each_get_their_own_descriptor(acl_samba, tree):
    files, problems = listing(acl_samba, "tree/many", access=True)
    assert len(files) == 40 and not problems
    for i in range(40):
        sids = {a.sid for a in files[f"{i:02d}.txt"].access.nt.dacl}
        assert f"S-1-5-21-1-2-3-{2000 + i}" in sids
        assert not any(s.startswith("S-1-5-21-1-2-3-") and s != f"S-1-5-21-1-2-3-{2000 + i}" for s in sids)


def test_a_descriptor_that_cannot_be_read_is_listed_closed_with_a_problem(acl_samba, tree):
    files, problems = listing(acl_samba, "tree", access=True)
    assert files["locked.txt"].access == FileAccess(nt=NtAccess(owner=None, dacl=()))
    assert "cannot read permissions" in problems["locked.txt"]
    assert "STATUS_ACCESS_DENIED" in problems["locked.txt"]
    assert files["locked.txt"].size == 4  # listed all the same


def test_an_acl_changed_without_new_content_is_read_again_at_the_next_walk(acl_samba, tree):
    path = _file(acl_samba, "changing/report.txt", b"same content")
    smbcacls(acl_samba, "changing/report.txt", "--set", _ace(acl_samba.owner, FULL))
    before, _ = listing(acl_samba, "changing", access=True)
    smbcacls(acl_samba, "changing/report.txt", "--add", _ace(OTHER_USER, READ))
    after, problems = listing(acl_samba, "changing", access=True)
    assert not problems and path.read_bytes() == b"same content"
    old, new = before["report.txt"], after["report.txt"]
    assert (old.size, old.mtime) == (new.size, new.mtime)  # nothing for size + mtime to notice
    assert old.access.nt.dacl == (Ace(acl_samba.owner, True, FULL, 0),)
    assert Ace(OTHER_USER, True, READ, 0) in new.access.nt.dacl
    assert new.access == FileAccess(nt=descriptor(acl_samba, "changing/report.txt"))


def test_skip_access_reads_only_the_descriptors_whose_change_time_moved(acl_samba, tree):
    """`permission_checks: changed`: the listing's change time is each file's stamp; files whose stamp the
    caller already holds are listed UNCHANGED with no query (no message), a file whose change time moved is
    read again. Samba reports the modification time as the change time: rewriting the content moves it; an
    ACL change alone does not (why `every-crawl` is the default)."""
    from kdbl_core.access.share_acl import UNCHANGED

    with connect(acl_samba, path="tree/many") as connector:
        first = {f.key: f for f in connector.walk(access=True)}
    stamps = {k: f.access_stamp for k, f in first.items()}
    assert len(stamps) == 40 and all(stamps.values())
    with connect(acl_samba, path="tree/many") as connector:
        plain = list(connector.walk())
        listing_only = _messages(connector)
    with connect(acl_samba, path="tree/many") as connector:
        again = {f.key: f for f in connector.walk(access=True, skip_access=lambda k, s: stamps.get(k) == s)}
        skipping = _messages(connector)
    assert len(plain) == 40 and all(f.access is UNCHANGED for f in again.values())
    assert skipping <= listing_only + 1  # no descriptor query at all (an ECHO for credits at most)
    time.sleep(0.01)
    _file(acl_samba, "tree/many/07.txt", b"new content")
    smbcacls(acl_samba, "tree/many/07.txt", "--add", _ace("S-1-5-21-1-2-3-2007", READ))
    smbcacls(acl_samba, "tree/many/08.txt", "--add", _ace(OTHER_USER, READ))  # an ACL change alone
    with connect(acl_samba, path="tree/many") as connector:
        after = {f.key: f for f in connector.walk(access=True, skip_access=lambda k, s: stamps.get(k) == s)}
    assert after["07.txt"].access == FileAccess(nt=descriptor(acl_samba, "tree/many/07.txt"))
    assert after["07.txt"].access_stamp != stamps["07.txt"]
    assert after["08.txt"].access is UNCHANGED  # Samba: the change time did not move
    assert all(after[k].access is UNCHANGED for k in stamps if k != "07.txt")


def test_bench_smb_permissions_measures_the_three_listings(acl_samba, tree, capsys):
    from kdbl_control import bench_smb_permissions
    from kdbl_control.cli import main

    result = bench_smb_permissions.walk_costs({"server": acl_samba.host, "share": "acls", "path": "tree/many",
                                               "credentials": {"env": ENV}}, runs=1)
    plain, every, unchanged = result["walk"], result["walk_access"], result["walk_access_unchanged"]
    assert plain["files"] == every["files"] == unchanged["files"] == 40
    assert plain["descriptors_read"] == 0 and every["descriptors_read"] == 40 and unchanged["descriptors_read"] == 0
    assert every["messages_per_file"] >= 3 > unchanged["messages_per_file"]  # a compound of three a file, or none
    with pytest.raises(SystemExit) as done:
        main(["bench", "smb-permissions", "--server", acl_samba.host, "--share", "acls", "--path", "tree/many",
              "--credentials-env", f"username={ENV['username']},password={ENV['password']}", "--runs", "1"])
    assert done.value.code == 0
    assert "walk(access=True): every-crawl" in capsys.readouterr().out


def test_changed_checks_crawl_keeps_sets_until_the_change_time_or_the_full_check_says_otherwise(
        acl_samba, tree, owner_engine, worker_engine):
    """Through the worker's listing: the first crawl reads every descriptor and stores the stamps; the next
    reads none and keeps every file's set; a full check (permission_full_check_hours: 0) reads them all
    again and so sees an ACL change Samba's change time hides."""
    from helpers import Corpus, crawl, db_of
    from sqlalchemy import text

    from kdbl_control import admin

    _file(acl_samba, "checks/a.txt", b"alpha")
    _file(acl_samba, "checks/b.txt", b"bravo")
    smbcacls(acl_samba, "checks/b.txt", "--set", _ace(acl_samba.owner, FULL))
    try:
        db = db_of(owner_engine)
        tenant = f"smbchk-{uuid.uuid4().hex[:8]}"
        t = admin.create_tenant(db, tenant)
        config = {"server": acl_samba.host, "share": "acls", "path": "checks", "credentials": {"env": ENV},
                  "base_delay": 0.01, "permission_checks": "changed", "permission_full_check_hours": 1}
        s = admin.add_source(db, tenant, protocol="smb", name="checks", permissions="from-source", config=config,
                             permission_map={OTHER_USER: "user:bob"})
        corpus = Corpus(tenant, t.id, s.id, acl_samba.root / "checks")

        def state() -> dict[str, tuple]:
            with owner_engine.begin() as conn:
                return {r.key: (r.permission_set, r.access_stamp) for r in conn.execute(text(
                    "SELECT key, permission_set, access_stamp FROM files WHERE source_id = :s"), {"s": s.id})}

        crawl(worker_engine, corpus)
        crawl(worker_engine, corpus)  # files written by the first crawl get their stamps here
        first = state()
        assert set(first) == {"a.txt", "b.txt"} and all(v[0] and v[1] for v in first.values())
        smbcacls(acl_samba, "checks/b.txt", "--add", _ace(OTHER_USER, READ))  # Samba: no change time moves
        crawl(worker_engine, corpus)
        assert state() == first  # kept: the change time says nothing changed
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE sources SET config = config || '{\"permission_full_check_hours\": 0}'::jsonb "
                              "WHERE id = :s"), {"s": s.id})
        crawl(worker_engine, corpus)
        full = state()
        assert full["b.txt"][0] != first["b.txt"][0] and full["a.txt"] == first["a.txt"]
        with owner_engine.begin() as conn:
            assert conn.execute(text("SELECT permissions_checked_at IS NOT NULL FROM sources WHERE id = :s"),
                                {"s": s.id}).scalar()
    finally:
        shutil.rmtree(acl_samba.root / "checks")


# -- through the crawl and row-level security -----------------------------------------------------------

async def test_a_from_source_smb_crawl_gives_each_principal_what_the_dacls_allow(
        acl_samba, tree, owner_engine, worker_engine, api_pool):
    """The leak probe on NT ACLs: user and group SIDs mapped to principals, a deny entry (wins), an inherited
    deny, Everyone, an unreadable descriptor, unmapped SIDs matched by a SID group claim."""
    from helpers import Corpus, crawl, db_of

    from kdbl_control import admin
    from kdbl_core.access.principal import Principal, rls_transaction

    _file(acl_samba, "tree/sid/only.txt")  # readable by its owner and one SID nobody mapped; removed after
    try:
        smbcacls(acl_samba, "tree/sid/only.txt", "--set",
                 ",".join([_ace(acl_samba.owner, FULL), _ace("S-1-5-21-1-2-3-2005", READ)]))
        db = db_of(owner_engine)
        tenant = f"smbacl-{uuid.uuid4().hex[:8]}"
        t = admin.create_tenant(db, tenant)
        s = admin.add_source(db, tenant, protocol="smb", name="acls", permissions="from-source",
                             config={"server": acl_samba.host, "share": "acls", "path": "tree",
                                     "credentials": {"env": ENV}, "base_delay": 0.01},
                             permission_map={OTHER_USER: "user:bob", GROUP: "group:domain-users",
                                             DENIED_USER: "user:mallory", acl_samba.owner: "user:svc"})
        stats = crawl(worker_engine, Corpus(tenant, t.id, s.id, acl_samba.root / "tree"))
        assert stats.indexed == 3 + 2 + 40 + 1 + 1

        async def readable(user: str, *groups: str) -> set[str]:
            principal = Principal(tenant_id=t.id, tenant_name=tenant, subject=f"user:{user}", groups=groups)
            async with rls_transaction(api_pool, principal) as conn:
                return {r.key for r in await (await conn.execute("SELECT key FROM files")).fetchall()}

        mallory, bob = await readable("mallory"), await readable("bob", "domain-users")
        zed, svc = await readable("zed"), await readable("svc")
        carol = await readable("carol", "S-1-5-21-1-2-3-2005")  # a SID group claim: matches sid:S-...
        assert "explicit.txt" not in mallory and "explicit.txt" in bob and "explicit.txt" in zed  # deny wins
        assert "denied.txt" not in bob and "denied.txt" in mallory and "denied.txt" in zed  # a group's deny
        assert "everyone.txt" in mallory & bob & zed & carol
        assert "inherit/child.txt" in bob and "inherit/child.txt" not in mallory  # inherited allow and deny
        assert "locked.txt" not in mallory | bob | zed | svc | carol  # no descriptor: nobody
        assert "sid/only.txt" in carol and "sid/only.txt" not in zed | bob | mallory
        assert "explicit.txt" in svc  # the owner's SID, mapped
    finally:
        shutil.rmtree(acl_samba.root / "tree" / "sid")


# -- the parser on descriptors Samba would not write -------------------------------------------------------


def _sid_bytes(sid: str) -> bytes:
    _, revision, authority, *subs = sid.split("-")
    return bytes([int(revision), len(subs)]) + int(authority).to_bytes(6, "big") + b"".join(
        int(s).to_bytes(4, "little") for s in subs)


def _sd(control: int, owner: str | None, aces: list[bytes] | None) -> bytes:
    body, owner_at, dacl_at = b"", 0, 0
    if owner is not None:
        owner_at, body = 20, _sid_bytes(owner)
    if aces is not None:
        dacl_at = 20 + len(body)
        acl = b"".join(aces)
        header = bytes([2, 0]) + (8 + len(acl)).to_bytes(2, "little") + len(aces).to_bytes(2, "little")
        body += header + b"\0\0" + acl
    return (bytes([1, 0]) + control.to_bytes(2, "little") + owner_at.to_bytes(4, "little") + bytes(8)
            + dacl_at.to_bytes(4, "little") + body)


def _ace_bytes(kind: int, flags: int, mask: int, sid: str) -> bytes:
    tail = mask.to_bytes(4, "little") + _sid_bytes(sid)
    return bytes([kind, flags]) + (4 + len(tail)).to_bytes(2, "little") + tail


def test_parser_null_dacl_object_aces_and_malformed_descriptors():
    owner = "S-1-5-21-1-2-3-1000"
    assert parse_security_descriptor(_sd(0x8000, owner, None)) == NtAccess(owner, None)  # no DACL: NULL
    assert parse_security_descriptor(_sd(0x8004, None, [])) == NtAccess(None, ())  # empty: nobody
    object_ace = bytes([0x05, 0, 12, 0]) + bytes(8)  # ACCESS_ALLOWED_OBJECT: skipped, not misread
    parsed = parse_security_descriptor(_sd(0x8004, owner, [
        object_ace, _ace_bytes(1, 0x10, 1, "S-1-1-0"), _ace_bytes(2, 0, 1, owner)]))  # 2: audit, skipped
    assert parsed == NtAccess(owner, (Ace("S-1-1-0", False, 1, 0x10),))
    good = _sd(0x8004, owner, [_ace_bytes(0, 0, READ, owner)])
    for bad in (b"", good[:30], good[:-2], b"\x02" + good[1:]):
        with pytest.raises(ValueError):
            parse_security_descriptor(bad)
