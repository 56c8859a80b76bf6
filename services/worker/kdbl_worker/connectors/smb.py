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
decide what changed). Owners are not read: that costs a security-descriptor query per file. Keys are POSIX
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
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import random
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import Any, BinaryIO, TypeVar

import smbclient
from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import SmbConfig, parse
from smbprotocol.exceptions import SMBConnectionClosed, SMBException, SMBOSError, SMBResponseException
from smbprotocol.file_info import FileAttributes
from smbprotocol.header import NtStatus
from smbprotocol.open import CreateOptions

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

    def walk(self) -> Iterator[FileMeta]:
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
            for info in sorted(entries, key=lambda i: i.file_name):
                key = f"{folder}/{info.file_name}" if folder else info.file_name
                if info.file_attributes & FileAttributes.FILE_ATTRIBUTE_REPARSE_POINT:
                    self.problems.add(key, f"{REPARSE_POINT}; skipped")
                elif not info.file_attributes & FileAttributes.FILE_ATTRIBUTE_DIRECTORY:
                    yield FileMeta(key=key, size=info.end_of_file,
                                     mtime=info.last_write_time.astimezone(UTC))
                elif info.file_id and info.file_id in seen:
                    self.problems.add(key, "folder loop (a link to a folder listed already); skipped")
                elif depth + 1 > cfg.max_depth:
                    self.problems.add(key, f"deeper than max_depth {cfg.max_depth}; skipped")
                else:
                    seen.add(info.file_id)
                    subdirs.append(key)
            stack.extend((sub, depth + 1) for sub in reversed(subdirs))

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
