"""Permissions taken from the share (issue 30): who may read a file, from its POSIX bits and ACL or its NTFS
access list, as rules that row-level security evaluates beside the grants.

A file's rules are a tuple of *checks*; the caller may read the file when every check passes. A check is an
ordered tuple of (subject, allow) entries: the first entry whose subject is one of the caller's subjects
(`Principal.subjects`, or `EVERYONE`, which every caller of the tenant matches) decides; none matches: the
check fails. Closed by default: a file of a `from-source` source with no rules is read by nobody but the
grants an administrator adds.

POSIX (local and NFS folders), as the Linux kernel's permission check does it (acl(5), "access check
algorithm"): the owner's class, then named users, then the group class (the owning group and named groups:
any of the caller's groups granting read allows, else denied), then other. The ACL's mask limits named users
and the group class; a mask of 0 makes the kernel skip the ACL (named users and groups then read as
"other": fs/namei.c). tests/unit/test_share_acl.py holds the rules to what the kernel lets real users read. A file needs `r` on itself and `x` (search) on every folder above it inside the source's root:
one check each (folders with the same bits share their check, and the rules are deduplicated).

NTFS (SMB shares): the DACL's entries for the read right (FILE_READ_DATA or GENERIC_READ / GENERIC_ALL);
deny wins over allow whatever their order (more conservative than Windows, where an explicit allow placed
before an inherited deny lets the reader in); entries that only propagate to children (INHERIT_ONLY) are
not the file's own; a NULL DACL is open to everyone, an empty one to nobody.

Subjects: `user:NAME`, `group:NAME` (the grants' forms, matched by OIDC subjects, group claims and tokens),
numeric ids kept when unmapped (`uid:1000`, `gid:100`), SIDs as `sid:S-1-5-...` (an OIDC group claim that is a
SID matches it: `Principal.subjects`). The well-known Everyone and Authenticated Users SIDs are `EVERYONE`.
"""

from __future__ import annotations

import grp
import hashlib
import json
import pwd
import re
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from kdbl_core.errors import ConfigError, InvalidArgument

EVERYONE = "*"

# `--permissions` (CLI, Source CRD spec.permissions) -> sources.acl_mode
PERMISSION_MODES = {"tenant": "tenant", "grants": "restricted", "from-source": "source"}
PERMISSIONS_OF_MODE = {mode: name for name, mode in PERMISSION_MODES.items()}
# protocols whose listing carries per-file permissions; s3 and webdav/http have no per-object readers
# K-Lake could map (bucket policies and IAM are evaluated per request by the server, WebDAV ACL (RFC 3744) is
# rarely served): their sources use grants, whole or per file (`grant add [--key]`)
FROM_SOURCE_PROTOCOLS = ("fs", "smb")

Entry = tuple[str, bool]
Check = tuple[Entry, ...]
Rules = tuple[Check, ...]

# POSIX ACL tags (linux/posix_acl.h) and the read / search bits of an entry's perm
ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
READ, EXECUTE = 0x4, 0x1
_ACL_XATTR_VERSION = 2
_UNDEFINED_ID = 0xFFFFFFFF

# NT access mask bits that give read access to a file's data, and ACE types / flags (MS-DTYP 2.4.4.1)
FILE_READ_DATA, GENERIC_ALL, GENERIC_READ, MAXIMUM_ALLOWED = 0x1, 0x10000000, 0x80000000, 0x02000000
ACCESS_ALLOWED, ACCESS_DENIED = 0x00, 0x01
INHERIT_ONLY, INHERITED = 0x08, 0x10
_READ_BITS = FILE_READ_DATA | GENERIC_ALL | GENERIC_READ

WELL_KNOWN_SIDS: dict[str, str] = {
    "S-1-1-0": EVERYONE,  # Everyone
    "S-1-5-11": EVERYONE,  # Authenticated Users
}
_SID = re.compile(r"^S-1-\d+(-\d+)+$")


def acl_mode(permissions: str, protocol: str) -> str:
    """sources.acl_mode for `--permissions`; InvalidArgument naming `permissions` when the protocol
    cannot say who may read its files."""
    if permissions not in PERMISSION_MODES:
        raise InvalidArgument("permissions", f"{permissions!r}: want one of {', '.join(PERMISSION_MODES)}")
    if permissions == "from-source" and protocol not in FROM_SOURCE_PROTOCOLS:
        raise InvalidArgument("permissions", f"a {protocol} source carries no per-file readers K-Lake can read; "
                              "use --permissions grants and grant the whole source or files one by one (grant add [--key])")
    return PERMISSION_MODES[permissions]


def is_sid(value: str) -> bool:
    return bool(_SID.match(value))


@dataclass(frozen=True, slots=True)
class PosixAcl:
    """A POSIX ACL's entries: (tag, id, perm); id is None for the owner, owning group, mask and other."""

    entries: tuple[tuple[int, int | None, int], ...]


@dataclass(frozen=True, slots=True)
class PosixAccess:
    """What a POSIX folder says of one file or folder: owner, group, permission bits, extended ACL."""

    uid: int
    gid: int
    mode: int
    acl: PosixAcl | None = None


@dataclass(frozen=True, slots=True)
class Ace:
    sid: str
    allow: bool
    mask: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class NtAccess:
    """An NTFS security descriptor's owner and DACL (None: a NULL DACL, open to everyone)."""

    owner: str | None
    dacl: tuple[Ace, ...] | None


@dataclass(frozen=True, slots=True)
class FileAccess:
    """A listed file's permissions as the share states them: its own and its folders' (POSIX, nearest the
    root first) or its security descriptor (SMB)."""

    posix: PosixAccess | None = None
    folders: tuple[PosixAccess, ...] = ()
    nt: NtAccess | None = None


# A listed file whose permissions the connector did not read again: their stamp (FileMeta.access_stamp) is the
# one they were last read with, so they keep their permission set (kdbl_worker.share_permissions).
UNCHANGED = "unchanged"


def parse_posix_acl(blob: bytes) -> PosixAcl:
    """The `system.posix_acl_access` extended attribute (little-endian: a 4-byte version, then 8-byte entries
    of tag u16, perm u16, id u32). Raises ValueError on anything else."""
    if len(blob) < 4 or (len(blob) - 4) % 8:
        raise ValueError("not a POSIX ACL attribute")
    if int.from_bytes(blob[:4], "little") != _ACL_XATTR_VERSION:
        raise ValueError("unknown POSIX ACL version")
    entries = []
    for at in range(4, len(blob), 8):
        tag = int.from_bytes(blob[at:at + 2], "little")
        perm = int.from_bytes(blob[at + 2:at + 4], "little")
        ident = int.from_bytes(blob[at + 4:at + 8], "little")
        entries.append((tag, None if ident == _UNDEFINED_ID or tag not in (ACL_USER, ACL_GROUP) else ident, perm))
    return PosixAcl(tuple(entries))


@dataclass
class PrincipalMap:
    """Numeric ids and SIDs to subjects: the admin's map first (`uid:1000` / `gid:100` / a SID ->
    `user:NAME`, `group:NAME` or `*`), then, for POSIX ids, the crawling host's user database
    (`host_names`), else the numeric form (`uid:N`, `gid:N`, `sid:S-...`)."""

    names: Mapping[str, str] = field(default_factory=dict)
    host_names: bool = True

    def __post_init__(self) -> None:
        self._cache: dict[str, str] = {}
        for key, value in self.names.items():
            if not (value == EVERYONE or (value.startswith(("user:", "group:", "sid:"))
                                          and len(value.partition(":")[2]) > 0)):
                raise ConfigError(f"permission map: {key!r} maps to {value!r}; want 'user:NAME', 'group:NAME' "
                                  f"or '{EVERYONE}' (everyone in the tenant)")
            if not (key.startswith(("uid:", "gid:")) or is_sid(key)):
                raise ConfigError(f"permission map: key {key!r} is not 'uid:N', 'gid:N' or a SID (S-1-...)")

    def user(self, uid: int) -> str:
        return self._posix("uid", uid, lambda: f"user:{pwd.getpwuid(uid).pw_name}")

    def group(self, gid: int) -> str:
        return self._posix("gid", gid, lambda: f"group:{grp.getgrgid(gid).gr_name}")

    def _posix(self, kind: str, number: int, host: Callable[[], str]) -> str:
        """The map's name for `kind:number`, else the host database's (`host`), else `kind:number`."""
        key = f"{kind}:{number}"
        if key not in self._cache:
            name = self.names.get(key)
            if name is None and self.host_names:
                try:
                    name = host()
                except KeyError:
                    name = None
            self._cache[key] = name or key
        return self._cache[key]

    def sid(self, sid: str) -> str:
        return self.names.get(sid) or WELL_KNOWN_SIDS.get(sid) or f"sid:{sid}"


def _bit_check(access: PosixAccess, bit: int, names: PrincipalMap) -> Check:
    """The entries deciding `bit` (READ or EXECUTE) for `access`, in the kernel's order."""
    mode = access.mode
    owner_bits, group_bits, other_bits = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    if access.acl is None or not group_bits:
        # with an ACL the group bits are its mask; Linux consults the ACL only when they are not all clear
        # (fs/namei.c acl_permission_check): a mask of 0 leaves named users and groups to "other"
        return ((names.user(access.uid), bool(owner_bits & bit)),
                (names.group(access.gid), bool(group_bits & bit)),
                (EVERYONE, bool(other_bits & bit)))
    entries = access.acl.entries
    mask = next((perm for tag, _, perm in entries if tag == ACL_MASK), 7)
    out: list[Entry] = []
    for tag, _, perm in entries:
        if tag == ACL_USER_OBJ:
            out.append((names.user(access.uid), bool(perm & bit)))
    out += [(names.user(ident), bool(perm & mask & bit)) for tag, ident, perm in entries
            if tag == ACL_USER and ident is not None]
    group_class = [(names.group(access.gid), bool(perm & mask & bit)) for tag, _, perm in entries
                   if tag == ACL_GROUP_OBJ]
    group_class += [(names.group(ident), bool(perm & mask & bit)) for tag, ident, perm in entries
                    if tag == ACL_GROUP and ident is not None]
    out += [e for e in group_class if e[1]] + [e for e in group_class if not e[1]]  # any group granting wins
    out += [(EVERYONE, bool(perm & bit)) for tag, _, perm in entries if tag == ACL_OTHER]
    return tuple(out)


def posix_rules(access: FileAccess, names: PrincipalMap) -> Rules:
    """`r` on the file, `x` on each folder above it (inside the source's root)."""
    if access.posix is None:
        raise ValueError("no POSIX permissions")
    checks = [_bit_check(access.posix, READ, names)]
    checks += [_bit_check(folder, EXECUTE, names) for folder in access.folders]
    return normalise(checks)


def nt_rules(nt: NtAccess, names: PrincipalMap) -> Rules:
    """The DACL's read entries, deny first (deny wins)."""
    if nt.dacl is None:
        return ((((EVERYONE, True),),))
    allows, denies = [], []
    for ace in nt.dacl:
        if ace.flags & INHERIT_ONLY or not ace.mask & (_READ_BITS | MAXIMUM_ALLOWED):
            continue
        if ace.allow and not ace.mask & _READ_BITS:
            continue  # MAXIMUM_ALLOWED alone grants nothing by itself
        (allows if ace.allow else denies).append(names.sid(ace.sid))
    entries: list[Entry] = [(s, False) for s in dict.fromkeys(denies)]
    entries += [(s, True) for s in dict.fromkeys(allows) if s not in denies]
    return normalise([tuple(entries)]) if entries else ((),)


def rules_for(access: FileAccess, names: PrincipalMap) -> Rules:
    if access.nt is not None:
        return nt_rules(access.nt, names)
    return posix_rules(access, names)


def _trim(check: Check) -> Check:
    """Entries after a subject's first are never reached; an EVERYONE entry ends the check, and the entries
    just before it that answer as it does change nothing (0644's check is EVERYONE alone: dropped)."""
    seen: set[str] = set()
    out: list[Entry] = []
    for subject, allow in check:
        if subject in seen:
            continue
        seen.add(subject)
        out.append((subject, allow))
        if subject == EVERYONE:
            while len(out) > 1 and out[-2][1] == allow:
                del out[-2]
            break
    return tuple(out)


def normalise(checks: Iterable[Check]) -> Rules:
    """Checks trimmed, those that pass for everyone dropped, duplicates removed, in a stable order."""
    out: dict[Check, None] = {}
    for check in checks:
        trimmed = _trim(check)
        if trimmed and trimmed[0] == (EVERYONE, True):
            continue  # the first entry matches every caller and allows
        out[trimmed] = None
    return tuple(sorted(out)) if out else ()


def allows(rules: Rules, subjects: Sequence[str]) -> bool:
    """Python's reading of the rules, the same as the database's kdbl_rules_allow (tests, `grant explain`)."""
    mine = set(subjects) | {EVERYONE}
    for check in rules:
        decided = next((allow for subject, allow in check if subject in mine), False)
        if not decided:
            return False
    return True


def deciding(rules: Rules, subjects: Sequence[str]) -> list[tuple[Check, Entry | None]]:
    """For each check, the entry that decides it for `subjects` (None: nothing matched, so denied)."""
    mine = set(subjects) | {EVERYONE}
    return [(check, next((e for e in check if e[0] in mine), None)) for check in rules]


def to_json(rules: Rules) -> str:
    return json.dumps([[[s, a] for s, a in check] for check in rules], separators=(",", ":"))


def from_json(text: str | list) -> Rules:
    data = json.loads(text) if isinstance(text, str) else text
    return tuple(tuple((str(s), bool(a)) for s, a in check) for check in data)


def digest(rules: Rules) -> str:
    return hashlib.sha256(to_json(rules).encode()).hexdigest()[:32]


def posix_access(st_mode: int, uid: int, gid: int, acl_blob: bytes | None) -> PosixAccess:
    acl = None
    if acl_blob:
        try:
            acl = parse_posix_acl(acl_blob)
        except ValueError:
            acl = PosixAcl(((ACL_USER_OBJ, None, 0), (ACL_GROUP_OBJ, None, 0), (ACL_OTHER, None, 0)))  # closed
    return PosixAccess(uid=uid, gid=gid, mode=stat.S_IMODE(st_mode), acl=acl)
