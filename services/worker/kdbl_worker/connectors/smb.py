"""Windows / Samba file shares (SMB 2/3) through smbprotocol's `smbclient`.

Config (the keys the operator writes from a Source's spec.connection; schema: kdbl_core.sources.config):
  server        required; host name or address of the file server
  share         required; the share name
  path          optional folder inside the share ("team/docs", "/" or "\\" separators); default: its root
  port          default 445
  domain        optional NTLM domain; a `domain` in the credentials reference wins
  credentials   required reference: {"env": {"username": VAR, "password": VAR, "domain": VAR}} or
                {"dir": PATH} (files `username`, `password`, optional `domain`)
  max_attempts  default 4: tries per operation when the connection fails (refused, reset, timed out) or the
                server is busy; a read that breaks mid-file re-opens the file and goes on at the same offset
  base_delay    default 0.5 s: scale of the exponential backoff between tries
  max_depth     default 64 folder levels
  connect_timeout  seconds, default 10

Each connector has its own connection pool (one TCP connection and session per server), closed by close().
Listing reads one folder at a time: size from end-of-file, mtime from last-write time (no etag; size + mtime
decide what changed). Owners are not read: that costs a security-descriptor query per file, which only
`walk(access=True)` pays (below). Keys are POSIX
paths relative to the base folder. Names that SMB cannot carry (e.g. a `?` in a Samba server's file name)
arrive in the server's mangled 8.3 form. The share as a whole failing (unreachable, authentication, missing
share or folder) raises SourceUnavailable; a sub-folder that cannot be listed is recorded in `problems`.

Links (issue 27): an entry the server marks as a reparse point (a Windows symbolic link or junction; Samba
with SMB3 POSIX extensions shows its symbolic links so) is never followed: the listing records it as skipped,
and `open` asks the server for the reparse point itself (FILE_OPEN_REPARSE_POINT) and refuses the handle
when it is one, so a file swapped for a link after the listing is not read through it. What the client
cannot see: a server that follows links itself and shows their targets as plain files (Samba's default
`follow symlinks = yes`; `wide links = no`, also its default, keeps them inside the share, not inside a
`path` within it), and a folder on the way swapped for a Windows symbolic link after the listing
(smbprotocol resolves that itself, within the same share only). Set `follow symlinks = no` on a share whose
writers must not reach its other folders; tests/integration/test_connectors_smb.py shows both settings.

Permissions from the share (issue 30): `walk(access=True)` lists each file with its security descriptor's
owner and DACL (`FileAccess(nt=NtAccess(...))`, kdbl_core.access.share_acl). SMB has no listing that carries
descriptors, so each file costs one more round trip: a compound CREATE (READ_CONTROL only, shared, the
reparse point itself) + QUERY_INFO (security: owner, DACL) + CLOSE, and up to SD_WINDOW of them are in
flight at once on the connection the listing uses. A file whose descriptor cannot be read (access denied to
READ_CONTROL, gone since the listing, an unreadable descriptor) is still listed, closed: an empty DACL, which
lets nobody in, and the reason is recorded in `problems`. The crawl account needs READ_CONTROL on every file
(owners have it implicitly unless an OWNER RIGHTS entry says otherwise; a group with Read gives it too).
tests/integration/test_smb_permissions.py checks the descriptors against Samba's own `smbcacls --numeric`.

Those queries cost ~0.8 ms of client CPU a file, so a re-crawl of an unchanged share lists ~600 files/s
instead of ~5,000. The listing's change time (`FileMeta.access_stamp`) lets a caller skip them
(`walk(skip_access=...)`: the source's `permission_checks: changed`): a Windows server moves a file's change
time when its ACL changes, inherited entries rewritten included. Samba does not — it reports the
modification time as the change time, and an ACL change moves neither — so against Samba only
`every-crawl` (the default) sees a permission change at the next crawl.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import io
import logging
import random
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import Any, BinaryIO, TypeVar

import smbclient
from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import SmbConfig, parse
from smbclient._pool import get_smb_tree
from smbprotocol.exceptions import SMBConnectionClosed, SMBException, SMBOSError, SMBResponseException
from smbprotocol.file_info import FileAttributes, InfoType
from smbprotocol.header import NtStatus
from smbprotocol.open import (
    CreateDisposition,
    CreateOptions,
    FilePipePrinterAccessMask,
    ImpersonationLevel,
    ShareAccess,
    SMB2CloseRequest,
    SMB2CreateRequest,
    SMB2QueryInfoRequest,
)

from kdbl_core.access.share_acl import ACCESS_ALLOWED, ACCESS_DENIED, UNCHANGED, Ace, FileAccess, NtAccess
from kdbl_core.content.records import FileMeta
from kdbl_worker.connectors import (
    ClosingConnector,
    ListingProblems,
    OutsideSource,
    SourceUnavailable,
    read_credentials,
    valid_key,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
READ_CHUNK = 1024 * 1024
MAX_DELAY = 30.0
_BUSY = {NtStatus.STATUS_INSUFFICIENT_RESOURCES, NtStatus.STATUS_INSUFF_SERVER_RESOURCES,
         NtStatus.STATUS_IO_TIMEOUT, NtStatus.STATUS_SERVER_UNAVAILABLE, NtStatus.STATUS_NETWORK_NAME_DELETED,
         NtStatus.STATUS_USER_SESSION_DELETED, 0xC000035C}  # the last: STATUS_NETWORK_SESSION_EXPIRED
_AUTH = {NtStatus.STATUS_LOGON_FAILURE, NtStatus.STATUS_WRONG_PASSWORD, NtStatus.STATUS_PASSWORD_EXPIRED,
         0xC0000072, 0xC000006E, 0xC0000193, 0xC0000234}  # account disabled/restricted/expired/locked out
REPARSE_POINT = "reparse point (a symbolic link, junction or DFS link) not followed"
DFS_LINK = "a DFS link on the way leads to another share; not followed"
_REASONS = {
    NtStatus.STATUS_ACCESS_DENIED: "access denied",
    NtStatus.STATUS_BAD_NETWORK_NAME: "no such share",
    NtStatus.STATUS_NOT_FOUND: "no such share or folder",
    NtStatus.STATUS_OBJECT_NAME_NOT_FOUND: "no such file or folder",
    NtStatus.STATUS_OBJECT_PATH_NOT_FOUND: "no such folder",
    NtStatus.STATUS_NOT_A_DIRECTORY: "not a folder",
}


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, SMBOSError):
        return exc.ntstatus
    if isinstance(exc, SMBResponseException):
        return exc.status
    return None


def _reason(exc: BaseException) -> str:
    status = _status(exc)
    if status is None:
        return type(exc).__name__
    name = next((k for k, v in vars(NtStatus).items() if v == status and k.startswith("STATUS_")),
                f"NtStatus 0x{status:08x}")
    return f"{_REASONS[status]} ({name})" if status in _REASONS else name


def _transient(exc: BaseException) -> bool:
    """Worth another try on a fresh connection: a dropped or refused connection, a busy server."""
    status = _status(exc)
    if status is not None:
        return status in _BUSY
    # SMBConnectionClosed, smbprotocol's own timeouts (plain SMBException), socket errors, refused connects
    return isinstance(exc, SMBConnectionClosed | ConnectionError | TimeoutError) or type(exc) is SMBException


def _parts(value: str) -> list[str]:
    return [p for p in value.replace("\\", "/").split("/") if p]


# -- security descriptors (issue 30) -----------------------------------------------------------------------

SD_WINDOW = 32  # descriptor queries (3 messages, 3 credits each) in flight on one connection
SD_BUFFER = 65536  # the most a one-credit QUERY_INFO may ask for; larger: STATUS_BUFFER_TOO_SMALL, closed
OWNER_SECURITY_INFORMATION, DACL_SECURITY_INFORMATION = 0x1, 0x4
_DACL_PRESENT = 0x0004
_JUST_OPENED = b"\xff" * 16  # a related compound's file id: the file its CREATE opened (MS-SMB2 3.2.4.1.4)
_SMB2_HEADER_SIZE = 64
CLOSED = FileAccess(nt=NtAccess(owner=None, dacl=()))  # an empty DACL: nobody
_SD_HEADER = struct.Struct("<BBHIIII")
_ACL_HEADER = struct.Struct("<BBHHH")
_ACE_HEADER = struct.Struct("<BBHI")


def _sid(blob: bytes, at: int, limit: int | None = None) -> str:
    """MS-DTYP 2.4.2.2: revision, sub-authority count, a 48-bit big-endian authority, then little-endian
    32-bit sub-authorities; the string form of 2.4.2.1 (the authority in hex when it needs more than 32 bits,
    as Windows and Samba print it)."""
    limit = len(blob) if limit is None else limit
    if at + 8 > limit:
        raise ValueError("a SID runs past its end")
    revision, count = blob[at], blob[at + 1]
    authority = int.from_bytes(blob[at + 2:at + 8], "big")
    if revision != 1 or at + 8 + 4 * count > limit:
        raise ValueError("not a SID")
    subs = struct.unpack_from(f"<{count}I", blob, at + 8)
    shown = str(authority) if authority < 2 ** 32 else f"0x{authority:012X}"
    return "-".join(("S", "1", shown, *map(str, subs)))


def _dacl(blob: bytes, at: int) -> tuple[Ace, ...]:
    """The ACL's allow and deny entries (ACE types 0 and 1), in their order; object, callback, audit and
    other entries are skipped (none of them decides a file's read access on an SMB share)."""
    if at + _ACL_HEADER.size > len(blob):
        raise ValueError("the DACL runs past the descriptor")
    _, _, size, count, _ = _ACL_HEADER.unpack_from(blob, at)
    end = at + size
    if end > len(blob) or size < _ACL_HEADER.size:
        raise ValueError("the DACL runs past the descriptor")
    aces: list[Ace] = []
    pos = at + _ACL_HEADER.size
    for _ in range(count):
        if pos + 4 > end:
            raise ValueError("an ACE runs past its ACL")
        kind, flags, ace_size = blob[pos], blob[pos + 1], int.from_bytes(blob[pos + 2:pos + 4], "little")
        if ace_size < 4 or pos + ace_size > end:
            raise ValueError("an ACE runs past its ACL")
        if kind in (ACCESS_ALLOWED, ACCESS_DENIED):
            _, _, _, mask = _ACE_HEADER.unpack_from(blob, pos)
            aces.append(Ace(sid=_sid(blob, pos + 8, pos + ace_size), allow=kind == ACCESS_ALLOWED,
                            mask=mask, flags=flags))
        pos += ace_size
    return tuple(aces)


def parse_security_descriptor(blob: bytes) -> NtAccess:
    """A self-relative SECURITY_DESCRIPTOR (MS-DTYP 2.4.6) as the owner SID and the DACL. No DACL (the
    DACL_PRESENT bit clear, or present at offset 0) is a NULL DACL: None, open to everyone. Raises ValueError
    on a malformed descriptor. A parser of its own: smbprotocol's SMB2CreateSDBuffer takes ~40x the time
    (measured: 1.1 ms against 24 us for five entries), as much as the query's round trip."""
    if len(blob) < _SD_HEADER.size:
        raise ValueError("shorter than a security descriptor header")
    revision, _, control, owner_at, _, _, dacl_at = _SD_HEADER.unpack_from(blob)
    if revision != 1:
        raise ValueError(f"security descriptor revision {revision}")
    owner = _sid(blob, owner_at) if owner_at else None
    dacl = _dacl(blob, dacl_at) if control & _DACL_PRESENT and dacl_at else None
    return NtAccess(owner=owner, dacl=dacl)


def _credits(connection: Any) -> int:
    window = connection.sequence_window
    return window["high"] - window["low"]


def _ask_credits(tree: Any, wanted: int) -> None:
    """Enough credits for a full window of queries in flight: an ECHO asking the server for more (one round
    trip, once per connection; smbprotocol otherwise keeps what the logon gave, 64 with Samba)."""
    connection = tree.session.connection
    missing = wanted - _credits(connection)
    if missing > 0:
        connection.echo(sid=tree.session.session_id, credit_request=missing)


class _SecurityQueries:
    """Descriptor queries on one tree: per file a related compound CREATE (READ_CONTROL only, shared, the
    reparse point itself) + QUERY_INFO (owner and DACL) + CLOSE, sent without waiting (the caller bounds how
    many are in flight). The three messages are built once and reused with a new path: building
    smbprotocol's message objects costs more than sending them; the replies' bodies are read as bytes for
    the same reason."""

    def __init__(self, tree: Any) -> None:
        self.tree, self.connection = tree, tree.session.connection
        self.create = SMB2CreateRequest()
        self.create["impersonation_level"] = ImpersonationLevel.Impersonation
        self.create["desired_access"] = FilePipePrinterAccessMask.READ_CONTROL
        self.create["share_access"] = (ShareAccess.FILE_SHARE_READ | ShareAccess.FILE_SHARE_WRITE
                                       | ShareAccess.FILE_SHARE_DELETE)
        self.create["create_disposition"] = CreateDisposition.FILE_OPEN
        self.create["create_options"] = CreateOptions.FILE_OPEN_REPARSE_POINT
        self.query = SMB2QueryInfoRequest()
        self.query["info_type"] = InfoType.SMB2_0_INFO_SECURITY
        self.query["output_buffer_length"] = SD_BUFFER
        self.query["additional_information"] = OWNER_SECURITY_INFORMATION | DACL_SECURITY_INFORMATION
        self.query["file_id"] = _JUST_OPENED
        self.close = SMB2CloseRequest()
        self.close["file_id"] = _JUST_OPENED

    def send(self, path: str) -> list[Any]:
        self.create["buffer_path"] = path.encode("utf-16-le")
        session = self.tree.session
        return self.connection.send_compound([self.create, self.query, self.close], session.session_id,
                                             self.tree.tree_connect_id, related=True)

    def reply(self, requests: list[Any]) -> NtAccess | str:
        """The descriptor, or why not (the first failing reply's reason). Reads every reply of the compound,
        failed or not, as smbprotocol wants; a broken connection or a busy server raises (retried)."""
        bodies: list[bytes] = []
        failures: list[SMBResponseException] = []
        for request in requests:
            try:
                bodies.append(self.connection.receive(request)["data"].get_value())
            except SMBResponseException as exc:
                failures.append(exc)
        if failures:
            if _transient(failures[0]):
                raise failures[0]
            return _reason(failures[0])
        try:
            return parse_security_descriptor(_query_info_buffer(bodies[1]))
        except ValueError as exc:
            return f"unreadable security descriptor ({exc})"


def _query_info_buffer(body: bytes) -> bytes:
    """A QUERY_INFO reply's output buffer (MS-SMB2 2.2.38: its offset counts from the SMB2 header's start)."""
    offset, length = struct.unpack_from("<HI", body, 2)
    start = offset - _SMB2_HEADER_SIZE
    if start < 8 or start + length > len(body):
        raise ValueError("the reply's buffer runs past it")
    return body[start:start + length]


class SmbConnector(ClosingConnector):
    def __init__(self, config: dict[str, Any]) -> None:
        self.config: SmbConfig = parse("smb", config)  # type: ignore[assignment]
        if self.config.credentials is None:
            raise InvalidArgument("credentials", 'a reference is required: {"env": {...}} or {"dir": PATH}; '
                                                 "secret values are never stored in a source config")
        self.problems = ListingProblems()
        self._share_unc = f"\\\\{self.config.server}\\{self.config.share}".lower()  # what a handle's tree is
        self._pool: dict[str, Any] = {}  # smbclient connection cache: this connector's connections only
        self._auth: dict[str, Any] | None = None

    # -- plumbing -----------------------------------------------------------------------------------------

    def _kwargs(self) -> dict[str, Any]:
        """The session arguments every smbclient call takes (smbclient reconnects with them when needed)."""
        if self._auth is None:
            cfg = self.config
            secrets = read_credentials(cfg.credentials, required=("username", "password"),
                                       optional=("domain",))
            assert secrets is not None  # __init__ insists on a reference
            domain = secrets.get("domain") or cfg.domain
            self._auth = {"username": f"{domain}\\{secrets['username']}" if domain else secrets["username"],
                          "password": secrets["password"]}
        return {**self._auth, "port": self.config.port, "connection_cache": self._pool}

    def _unc(self, key: str = "") -> str:
        cfg = self.config
        return "\\".join((f"\\\\{cfg.server}", cfg.share, *cfg.path, *_parts(key)))

    def close(self) -> None:
        """Drop the TCP connections; the server ends the sessions. No logoff round trips: smbprotocol waits
        for their replies without a timeout, so a dead server (or a closing interpreter) would hang here."""
        pool = getattr(self, "_pool", None)
        if pool and sys.is_finalizing():  # smbprotocol's frozen reader threads would deadlock a disconnect
            return
        while pool:
            _, connection = pool.popitem()
            connection.disconnect(close=False)

    def _connect(self) -> None:
        """Log on (once per connection); authentication failures are final, connection failures retried."""
        cfg = self.config
        try:
            smbclient.register_session(cfg.server, connection_timeout=cfg.connect_timeout, **self._kwargs())
        except ValueError as exc:  # smbprotocol's wording for "could not open the TCP connection"
            raise ConnectionError(str(exc)) from exc
        except SMBException as exc:
            if _transient(exc):
                raise
            status = _status(exc)
            why = _reason(exc) if status in _AUTH else f"{_reason(exc)} while logging on"
            raise SourceUnavailable(f"{cfg.where}: authentication failed: {why}; check the credentials "
                                    "reference") from exc

    def _retry(self, doing: str, action: Callable[[], T]) -> T:
        """`action` on a live session, again on a fresh connection after transient failures (bounded)."""
        cfg = self.config
        for attempt in range(1, cfg.max_attempts + 1):
            try:
                self._connect()
                return action()
            except Exception as exc:
                if not _transient(exc):
                    raise
                self.close()
                if attempt == cfg.max_attempts:
                    raise SourceUnavailable(f"{cfg.where}: cannot reach the server while {doing} "
                                            f"({_reason(exc)}, {attempt} attempts)") from exc
                log.warning("SMB operation failed; retrying on a new connection", extra={
                    "share": cfg.where, "doing": doing, "error": _reason(exc), "attempt": attempt})
                time.sleep(random.random() * min(cfg.base_delay * 2 ** (attempt - 1), MAX_DELAY))
        raise AssertionError("unreachable")  # pragma: no cover

    def _unavailable(self, exc: OSError, doing: str) -> SourceUnavailable:
        return SourceUnavailable(f"{self.config.where}: {_reason(exc)} while {doing}")

    # -- the Connector interface --------------------------------------------------------------------------

    def check(self) -> None:
        def first_entry() -> None:
            with smbclient.scandir(self._unc(), **self._kwargs()) as entries:
                next(entries, None)

        try:
            self._retry("checking the share", first_entry)
        except OSError as exc:
            raise self._unavailable(exc, "checking the share") from exc

    def _list(self, folder: str) -> list[smbclient.SMBDirEntryInformation]:
        with smbclient.scandir(self._unc(folder), **self._kwargs()) as entries:
            return [entry.smb_info for entry in entries]

    def walk(self, access: bool = False,
             skip_access: Callable[[str, str], bool] | None = None) -> Iterator[FileMeta]:
        """The files under the base folder, folder by folder; with `access`, each with its security
        descriptor (`FileMeta.access`, see the module's notes), read for a folder's files together, and its
        change time as `access_stamp`. `skip_access(key, stamp)` true: the descriptor is not read (access
        share_acl.UNCHANGED); see the module's notes for the servers where that is safe."""
        cfg = self.config
        try:
            base = self._retry("reading the base folder",
                              lambda: smbclient.stat(self._unc(), **self._kwargs()))
        except OSError as exc:
            raise self._unavailable(exc, "reading the base folder") from exc
        if not base.st_file_attributes & FileAttributes.FILE_ATTRIBUTE_DIRECTORY:
            raise SourceUnavailable(f"{cfg.where}: not a folder")
        seen = {base.st_ino}
        stack = [("", 0)]
        while stack:
            folder, depth = stack.pop()
            try:
                entries = self._retry("listing a folder", functools.partial(self._list, folder))
            except OSError as exc:
                if not folder:
                    raise self._unavailable(exc, "listing the base folder") from exc
                self.problems.add(folder, f"cannot list folder: {_reason(exc)}")
                continue
            subdirs: list[str] = []
            files: list[FileMeta] = []
            for info in sorted(entries, key=lambda i: i.file_name):
                key = f"{folder}/{info.file_name}" if folder else info.file_name
                if info.file_attributes & FileAttributes.FILE_ATTRIBUTE_REPARSE_POINT:
                    self.problems.add(key, f"{REPARSE_POINT}; skipped")
                elif not info.file_attributes & FileAttributes.FILE_ATTRIBUTE_DIRECTORY:
                    files.append(FileMeta(key=key, size=info.end_of_file,
                                          mtime=info.last_write_time.astimezone(UTC),
                                          access_stamp=info.change_time.astimezone(UTC).isoformat()
                                          if access else None))
                elif info.file_id and info.file_id in seen:
                    self.problems.add(key, "folder loop (a link to a folder listed already); skipped")
                elif depth + 1 > cfg.max_depth:
                    self.problems.add(key, f"deeper than max_depth {cfg.max_depth}; skipped")
                else:
                    seen.add(info.file_id)
                    subdirs.append(key)
            yield from self._with_access(folder, files, skip_access) if access else files
            stack.extend((sub, depth + 1) for sub in reversed(subdirs))

    def _with_access(self, folder: str, files: list[FileMeta],
                     skip_access: Callable[[str, str], bool] | None) -> list[FileMeta]:
        """`files` (one folder's) with their descriptors, but those `skip_access` keeps (share_acl.UNCHANGED);
        closed, and a problem recorded, where one cannot be read. Retried as a whole on a fresh connection
        when the connection fails."""
        kept = {f.key for f in files if skip_access is not None and skip_access(f.key, f.access_stamp)}
        asked = [f for f in files if f.key not in kept]
        names = [f.key.rpartition("/")[2] for f in asked]
        found = self._retry("reading permissions", functools.partial(self._descriptors, folder, names)) if names else []
        results = dict(zip((f.key for f in asked), found, strict=True))
        out = []
        for meta in files:
            result = results.get(meta.key, UNCHANGED)
            if result is UNCHANGED:
                out.append(dataclasses.replace(meta, access=UNCHANGED))
                continue
            if isinstance(result, NtAccess):
                out.append(dataclasses.replace(meta, access=FileAccess(nt=result)))
            else:
                self.problems.add(meta.key, f"cannot read permissions: {result}; listed as readable by "
                                            "nobody")
                out.append(dataclasses.replace(meta, access=CLOSED, access_stamp=None))  # asked again next time
        return out

    def _descriptors(self, folder: str, names: list[str]) -> list[NtAccess | str]:
        """Each named file's descriptor, or why it could not be read. Up to SD_WINDOW compound queries in
        flight, each sent before the replies to those ahead of it arrive, so the files share their waits;
        on the tree and connection the listing used. Raises on a failed connection (the caller retries)."""
        tree, base = get_smb_tree(self._unc(folder), **self._kwargs())
        queries = _SecurityQueries(tree)
        _ask_credits(tree, 3 * min(SD_WINDOW, len(names)))
        results: list[NtAccess | str] = []
        pending: deque[list[Any]] = deque()
        for name in names:
            while pending and (len(pending) >= SD_WINDOW or _credits(queries.connection) < 3):
                results.append(queries.reply(pending.popleft()))
            pending.append(queries.send(f"{base}\\{name}" if base else name))
        while pending:
            results.append(queries.reply(pending.popleft()))
        return results

    def open(self, key: str) -> BinaryIO:
        if not valid_key(key) or "\\" in key:
            raise FileNotFoundError(errno.ENOENT, "not a valid key", key)
        stream = _Stream(self, key, self._open_raw(key))
        return io.BufferedReader(stream, READ_CHUNK)

    def _handle(self, key: str) -> Any:
        """An unbuffered handle on one file; shared access, so the crawl never locks users out of it. The
        reparse point itself when the name is one, refused (OutsideSource): never what it points at."""
        raw = smbclient.open_file(self._unc(key), mode="rb", buffering=0, share_access="rwd",
                                  create_options=CreateOptions.FILE_OPEN_REPARSE_POINT, **self._kwargs())
        if raw.fd.file_attributes & FileAttributes.FILE_ATTRIBUTE_REPARSE_POINT:
            raw.close()
            raise OutsideSource(REPARSE_POINT, key)
        if raw.fd.tree_connect.share_name.lower() != self._share_unc:
            raw.close()  # smbclient followed a DFS referral on the way: another share, maybe another server
            raise OutsideSource(DFS_LINK, key)
        return raw

    def _open_raw(self, key: str) -> Any:
        try:
            return self._retry("opening a file", functools.partial(self._handle, key))
        except OutsideSource:
            raise
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise FileNotFoundError(errno.ENOENT, "no such file on the share", key) from exc
            if _status(exc) == NtStatus.STATUS_ACCESS_DENIED:
                raise PermissionError(errno.EACCES, "the server refused access", key) from exc
            raise OSError(errno.EIO, _reason(exc), key) from exc


class _Stream(io.RawIOBase):
    """One file read front to back in the server's chunks. A connection that breaks mid-file is replaced and
    the file re-opened at the same offset, unless it changed in between (then the read fails with EAGAIN)."""

    def __init__(self, connector: SmbConnector, key: str, raw: Any) -> None:
        super().__init__()
        self._connector, self._key, self._raw = connector, key, raw
        self._version = raw.fd.end_of_file, raw.fd.last_write_time
        self._offset = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._connector._retry("reading a file", functools.partial(self._read, buffer))

    def _read(self, buffer: Any) -> int:
        if self._raw is None:
            raw = self._connector._handle(self._key)
            if (raw.fd.end_of_file, raw.fd.last_write_time) != self._version:
                raw.close()
                raise OSError(errno.EAGAIN, "the file changed while it was read", self._key)
            raw.seek(self._offset)
            self._raw = raw
        try:
            count = self._raw.readinto(buffer)
        except BaseException:
            self._drop()
            raise
        self._offset += count
        return count

    def _drop(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(SMBException, OSError):  # the connection is gone; so is the handle
                raw.close()

    def close(self) -> None:
        if not self.closed:
            self._drop()
        super().close()
