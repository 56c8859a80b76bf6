"""The share's permissions as rules (kdbl_core.access.share_acl), judged against the kernel itself: a random
tree of folders and files with random owners, groups, bits and POSIX ACLs, read by separate unix users
(child processes with their own uid and groups), must be readable exactly where the rules allow."""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import pytest

from kdbl_core.access import share_acl
from kdbl_core.access.share_acl import (
    ACL_GROUP,
    ACL_GROUP_OBJ,
    ACL_MASK,
    ACL_OTHER,
    ACL_USER,
    ACL_USER_OBJ,
    EVERYONE,
    Ace,
    NtAccess,
    PrincipalMap,
)
from kdbl_core.errors import ConfigError, InvalidArgument
from kdbl_worker.connectors.fs import FsConnector

USERS = {"alice": (5101, [6101]), "bob": (5102, [6101, 6102]), "carol": (5103, []), "dave": (5104, [6102])}
GROUPS = {6101: "eng", 6102: "ops"}
NAMES = PrincipalMap({**{f"uid:{uid}": f"user:{n}" for n, (uid, _) in USERS.items()},
                      **{f"gid:{gid}": f"group:{n}" for gid, n in GROUPS.items()}}, host_names=False)


def subjects(user: str) -> list[str]:
    uid, gids = USERS[user]
    return [f"user:{user}", *(f"group:{GROUPS[g]}" for g in gids)]


def acl_blob(entries: list[tuple[int, int, int | None]]) -> bytes:
    """The system.posix_acl_access attribute the kernel takes (setfacl writes the same)."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, 0xFFFFFFFF if ident is None else ident)
                                           for tag, perm, ident in entries)


def random_acl(rng: random.Random) -> bytes:
    entries = [(ACL_USER_OBJ, rng.choice([0, 4, 5, 6, 7]), None)]
    entries += [(ACL_USER, rng.choice([0, 4, 5, 7]), uid) for uid in rng.sample([5101, 5102, 5103, 5104], 2)]
    entries += [(ACL_GROUP_OBJ, rng.choice([0, 4, 5]), None)]
    entries += [(ACL_GROUP, rng.choice([0, 4, 5]), gid) for gid in rng.sample([6101, 6102], rng.randint(0, 2))]
    entries += [(ACL_MASK, rng.choice([4, 5, 7, 0]), None), (ACL_OTHER, rng.choice([0, 4, 5]), None)]
    return acl_blob(sorted(entries, key=lambda e: (e[0], e[2] or 0)))


@pytest.fixture(scope="module")
def tree():
    """~150 files in nested folders, owners, groups, bits and ACLs drawn at random (seeded)."""
    rng = random.Random(30)
    root = Path(tempfile.mkdtemp(prefix="kdbl-share-acl-"))
    root.chmod(0o755)  # the users reach the root; below it everything is drawn
    folders = [root]
    for n in range(14):
        folder = rng.choice(folders) / f"d{n}"
        folder.mkdir()
        folders.append(folder)
    for n in range(150):
        path = rng.choice(folders) / f"f{n}.txt"
        path.write_text(f"file {n}")
    for path in sorted(root.rglob("*"), reverse=True):
        os.chown(path, rng.choice([5101, 5102, 5103, 5104, 0]), rng.choice([6101, 6102, 0]))
        if path.is_dir():
            path.chmod(rng.choice([0o755, 0o750, 0o711, 0o700, 0o754, 0o701]))
        else:
            path.chmod(rng.choice([0o644, 0o640, 0o600, 0o604, 0o044, 0o440, 0o400, 0o004]))
        if rng.random() < 0.3:
            os.setxattr(path, "system.posix_acl_access", random_acl(rng))
    yield root
    shutil.rmtree(root)


# each path opened for reading by the shell (the interpreter under /root is not the test users' to run)
_PROBE = 'while IFS= read -r p; do if (exec <"$p") 2>/dev/null; then echo 1; else echo 0; fi; done'


def kernel_reads(user: str, paths: list[str]) -> dict[str, bool]:
    uid, gids = USERS[user]
    done = subprocess.run(["/bin/sh", "-c", _PROBE], input="".join(f"{p}\n" for p in paths), capture_output=True,
                          text=True, check=True, user=uid, group=gids[0] if gids else 65534,
                          extra_groups=gids, env={"PATH": "/usr/bin:/bin"}, cwd="/")
    answers = done.stdout.split()
    assert len(answers) == len(paths), done.stderr
    return {p: a == "1" for p, a in zip(paths, answers, strict=True)}


def test_the_rules_of_every_file_match_what_the_kernel_lets_each_user_read(tree) -> None:
    files = list(FsConnector(tree).walk(access=True))
    assert len(files) == 150 and all(f.access is not None and f.access.posix is not None for f in files)
    assert any(f.access.posix.acl is not None for f in files) and any(f.access.folders for f in files)
    paths = [str(tree / f.key) for f in files]
    seen = {True: 0, False: 0}
    for user in USERS:
        kernel = kernel_reads(user, paths)
        for meta, path in zip(files, paths, strict=True):
            rules = share_acl.rules_for(meta.access, NAMES)
            assert share_acl.allows(rules, subjects(user)) == kernel[path], (user, meta.key, rules)
            seen[kernel[path]] += 1
    assert seen[True] > 50 and seen[False] > 50  # the draw exercises both answers


def test_posix_bits_in_the_kernels_order() -> None:
    def rules(mode: int, uid: int = 5101, gid: int = 6101, folders=()):
        access = share_acl.FileAccess(posix=share_acl.PosixAccess(uid, gid, mode), folders=tuple(folders))
        return share_acl.posix_rules(access, NAMES)

    assert share_acl.allows(rules(0o600), subjects("alice")) and not share_acl.allows(rules(0o600), subjects("bob"))
    # the owner's class decides for the owner, even when the group and other may read
    assert not share_acl.allows(rules(0o044), subjects("alice")) and share_acl.allows(rules(0o044), subjects("bob"))
    # a member of the group is judged by the group's bits, not other's
    assert not share_acl.allows(rules(0o604), subjects("bob")) and share_acl.allows(rules(0o604), subjects("carol"))
    assert rules(0o644) == ()  # everyone reads: no check left
    # a folder without x for other closes the file to others, whatever the file's bits
    closed = rules(0o644, folders=[share_acl.PosixAccess(5102, 6102, 0o750)])
    assert share_acl.allows(closed, subjects("dave")) and not share_acl.allows(closed, subjects("carol"))


def test_unmapped_ids_stay_numeric_and_the_host_database_names_known_ones() -> None:
    names = PrincipalMap({}, host_names=True)
    assert names.user(0) == "user:root" and names.group(0) == "group:root"
    assert names.user(4242421) == "uid:4242421" and names.group(4242421) == "gid:4242421"
    assert PrincipalMap({}, host_names=False).user(0) == "uid:0"


def test_nt_access_lists_deny_wins_and_inherit_only_entries_are_not_the_files() -> None:
    names = PrincipalMap({"S-1-5-21-1-2-3-1104": "user:alice", "S-1-5-21-1-2-3-1201": "group:eng"})
    dacl = (Ace("S-1-5-21-1-2-3-1201", True, 0x120089),  # eng: read
            Ace("S-1-5-21-1-2-3-1104", False, 0x1, flags=0x10),  # alice denied (inherited), listed after
            Ace("S-1-5-21-1-2-3-1105", True, 0x1f01ff, flags=0x08),  # inherit only: not this file's
            Ace("S-1-5-21-1-2-3-1106", True, 0x100))  # no read right
    rules = share_acl.nt_rules(NtAccess(owner=None, dacl=dacl), names)
    assert not share_acl.allows(rules, ["user:alice", "group:eng"])  # deny wins over the earlier allow
    assert share_acl.allows(rules, ["user:bob", "group:eng"])
    assert not share_acl.allows(rules, ["sid:S-1-5-21-1-2-3-1105"]) and not share_acl.allows(rules, ["sid:S-1-5-21-1-2-3-1106"])
    everyone = share_acl.nt_rules(NtAccess(None, (Ace("S-1-1-0", True, 0x80000000),)), names)
    assert everyone == () and share_acl.allows(everyone, ["user:anyone"])
    assert share_acl.nt_rules(NtAccess(None, None), names) == ((( EVERYONE, True),),)  # NULL DACL: open
    assert not share_acl.allows(share_acl.nt_rules(NtAccess(None, ()), names), ["user:alice"])  # empty: nobody
    assert share_acl.allows(rules, ["user:bob", "sid:S-1-5-21-1-2-3-1201"]) is False  # mapped SIDs are names


def test_rules_round_trip_and_digest_is_stable() -> None:
    rules = share_acl.normalise([(("user:a", True), ("group:g", False), (EVERYONE, True), ("user:z", True))])
    assert rules == ((("user:a", True), ("group:g", False), (EVERYONE, True)),)  # nothing after '*' counts
    assert share_acl.from_json(share_acl.to_json(rules)) == rules
    assert share_acl.digest(rules) == share_acl.digest(share_acl.from_json(share_acl.to_json(rules)))


def test_a_bad_map_or_mode_is_refused_naming_what_to_change() -> None:
    with pytest.raises(ConfigError, match="uid:1"):
        PrincipalMap({"uid:1": "alice"})
    with pytest.raises(ConfigError, match="not 'uid:N'"):
        PrincipalMap({"alice": "user:alice"})
    with pytest.raises(InvalidArgument, match="permissions"):
        share_acl.acl_mode("from-source", "s3")
    assert share_acl.acl_mode("from-source", "smb") == "source" and share_acl.acl_mode("grants", "s3") == "restricted"


def test_a_damaged_acl_attribute_lets_nobody_read() -> None:
    access = share_acl.posix_access(0o100644, 5101, 6101, b"\x02\x00\x00\x00garbage")
    rules = share_acl.posix_rules(share_acl.FileAccess(posix=access), NAMES)
    assert not any(share_acl.allows(rules, subjects(u)) for u in USERS)
