"""Source connectors: one module per protocol, the same small interface (list, stat, open).

The containment rule every connector keeps: nothing outside a source is read. A link that leaves it (a
symbolic link out of an fs root, an SMB reparse point, an HTTP redirect off the base URL) is refused
with `OutsideSource` at open time and recorded in the listing's problems with its reason; the worker's
own private files (`refuse_paths`: kdbl-control up's data folder) are never read through any source.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Protocol

from kdbl_core.content.records import FileMeta
from kdbl_core.errors import InvalidArgument, PermanentError, TemporaryError


class SourceUnavailable(TemporaryError):
    """The source as a whole cannot be reached or listed; the crawl stops without deleting anything."""


class OutsideSource(PermissionError):
    """A link the source's rules do not follow: a symbolic link out of the root (or any, when the source
    does not follow them), a reparse point, a redirect off the base URL, the worker's private data.
    `strerror` is the reason recorded in the listing's problems and the file's status."""

    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(errno.EACCES, reason, key)


_REFUSED: list[str] = []
_REFUSED_LOCK = threading.Lock()


def refuse_paths(*paths: str | os.PathLike[str]) -> None:
    """Folders (and files) of this process's own that no source may read, whatever path reaches them: a
    symbolic or hard link, a source root that contains them. kdbl-control up registers its data folder
    (pg-password, the demo token, the database's files). Recognised by (device, inode), so a rename or
    another mount of the same folder is refused too."""
    with _REFUSED_LOCK:
        _REFUSED.extend(os.fspath(p) for p in paths if os.fspath(p) not in _REFUSED)


def refused_identities() -> frozenset[tuple[int, int]]:
    """(st_dev, st_ino) of each registered path and of the files and folders directly inside a registered
    folder (a hard link to one of them is the same inode). Read afresh at each call: a few stat calls."""
    with _REFUSED_LOCK:
        paths = list(_REFUSED)
    found: set[tuple[int, int]] = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        found.add((st.st_dev, st.st_ino))
        if stat.S_ISDIR(st.st_mode):
            try:
                with os.scandir(path) as entries:
                    for entry in entries:
                        with contextlib.suppress(OSError):
                            inner = entry.stat(follow_symlinks=False)
                            found.add((inner.st_dev, inner.st_ino))
            except OSError:
                continue
    return frozenset(found)


class ClosingConnector:
    """Lifecycle plumbing for connectors holding a network client: `close()` releases it, and the
    connector works as a context manager and closes itself when dropped (the pipeline drops them)."""

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        self.close()

    def __enter__(self) -> "ClosingConnector":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class ListingProblems:
    """Entries a listing could not use: recorded, never fatal."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.items.append((where, why))


class Connector(Protocol):
    problems: ListingProblems

    def walk(self) -> Iterator[FileMeta]:
        """Every file, as listed. The fs and smb connectors take `access=True` as well: each file with its
        permissions (FileMeta.access) for a source whose permissions come from the share."""
        ...

    def open(self, key: str) -> BinaryIO: ...

    def check(self) -> None:
        """Raise SourceUnavailable when the source cannot be reached at all."""


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_KEY_ID = re.compile(r"(AKIA|ASIA|AKID|AIDA|AROA)[A-Z0-9]{12,}")


def read_credentials(ref: object, *, required: tuple[str, ...],
                     optional: tuple[str, ...] = ()) -> dict[str, str] | None:
    """Resolve a source's credentials *reference*; None when the config names none.

    `{"env": {"username": "VAR", ...}}` reads environment variables, `{"dir": "/var/run/secrets/..."}`
    reads one file per name (a mounted Kubernetes Secret). Errors name the variable or file, never a value.
    """
    if ref is None:
        return None
    allowed = required + optional
    if not isinstance(ref, dict) or len(ref) != 1 or not ({"env", "dir"} & ref.keys()):
        raise InvalidArgument("credentials", 'must be a reference, {"env": {NAME: ENV_VAR}} or {"dir": '
                                             "PATH}; secret values are never stored in a source config")
    values: dict[str, str] = {}
    if "env" in ref:
        from kdbl_core.settings import named_env  # here: the sandbox's children import this package

        names = ref["env"]
        if not isinstance(names, dict):
            raise InvalidArgument("credentials.env",
                                  f"must map {', '.join(allowed)} to environment variable names")
        for name, var in names.items():
            if name not in allowed:
                raise InvalidArgument("credentials.env",
                                      f"unknown name '{name}' (expected {', '.join(allowed)})")
            if not isinstance(var, str) or not _ENV_NAME.fullmatch(var):
                raise InvalidArgument(f"credentials.env.{name}",
                                      "must be the name of an environment variable")
            value = named_env(var)
            if value is None:
                # Name the variable only when it looks like one: a pasted secret must not reach a log.
                shown = var if _SHOWN_ENV_NAME.fullmatch(var) and not _KEY_ID.fullmatch(var) else \
                    f"named by credentials.env.{name}"
                raise PermanentError(f"credentials: environment variable {shown} is not set ({name})")
            values[name] = value
    else:
        folder = ref["dir"]
        if not isinstance(folder, str) or not os.path.isabs(folder):
            raise InvalidArgument("credentials.dir", "must be an absolute path to a folder")
        for name in allowed:
            path = Path(folder) / name
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(65537)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise PermanentError(f"credentials: cannot read {path}: {exc.strerror}") from exc
            if len(raw) > 65536:
                raise PermanentError(f"credentials: {path} is too large for a credential")
            try:
                values[name] = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                raise PermanentError(f"credentials: {path} is not UTF-8 text") from None
    missing = [n for n in required if n not in values]
    if missing:
        where = "credentials.env" if "env" in ref else f"credentials dir {ref['dir']}"
        raise PermanentError(f"{where}: missing {', '.join(missing)}")
    return values


def valid_key(key: str) -> bool:
    """A relative POSIX key with no empty, '.' or '..' segment (nothing that could leave the root)."""
    return bool(key) and all(p not in ("", ".", "..") for p in key.split("/"))


def connector_for(protocol: str, config: dict) -> Connector:
    if protocol == "fs":
        from kdbl_worker.connectors.fs import FsConnector

        from kdbl_core.sources import FsConfig, parse

        fs: FsConfig = parse("fs", config)  # type: ignore[assignment]
        return FsConnector(fs.root, follow_symlinks=fs.follow_symlinks)
    if protocol == "s3":
        from kdbl_worker.connectors.s3 import S3Connector

        return S3Connector(config)
    if protocol == "smb":
        from kdbl_worker.connectors.smb import SmbConnector

        return SmbConnector(config)
    if protocol == "webdav":
        from kdbl_worker.connectors.webdav import WebDavConnector

        return WebDavConnector(config)
    if protocol == "http":
        from kdbl_worker.connectors.webdav import HttpIndexConnector

        return HttpIndexConnector(config)
    raise PermanentError(f"protocol '{protocol}' is not supported by this worker yet")
