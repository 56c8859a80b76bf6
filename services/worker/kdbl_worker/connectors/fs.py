"""POSIX / NFS mounts: recursive listing with size, mtime, owner, mode, uid and gid.

Symlinks to files are followed; directory loops (a symlink to an ancestor) and unreadable
entries are recorded in `problems` and skipped, never fatal.

File names are bytes; keys are text (Postgres `text`, `kdbl://` URIs). A name that is not valid
UTF-8 still gets a key, reversibly (`key_from_bytes` / `key_to_bytes`): each byte 0x80-0xFF that is
not part of a valid UTF-8 sequence becomes the private-use character U+EF80-U+EFFF (U+EF00 + byte,
the MirBSD OPTU-8 mapping), and a genuine U+EF80-U+EFFF in a name is written as its three UTF-8 bytes
mapped the same way, so every name has exactly one key and every key maps back to the exact bytes.
Valid UTF-8 names (nearly all) keep their key unchanged.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from kdbl_core.content.records import FileMeta
from kdbl_worker.connectors import ListingProblems, SourceUnavailable

__all__ = ["FsConnector", "SourceUnavailable", "key_from_bytes", "key_to_bytes"]

log = logging.getLogger(__name__)

_ESCAPED = re.compile(r"[\uef80-\uefff]")
# surrogateescape's stand-ins for undecodable bytes (U+DC80-U+DCFF) <-> U+EF80-U+EFFF
_TO_PRIVATE = {0xDC00 + b: 0xEF00 + b for b in range(0x80, 0x100)}
_TO_SURROGATE = {v: k for k, v in _TO_PRIVATE.items()}


def _escape_bytes(match: re.Match[str]) -> str:
    return "".join(chr(0xEF00 + b) for b in match.group().encode("utf-8"))


def key_from_bytes(raw: bytes) -> str:
    """A relative path in bytes -> its key (valid UTF-8 text; see the module docstring)."""
    text = raw.decode("utf-8", "surrogateescape")
    return _ESCAPED.sub(_escape_bytes, text).translate(_TO_PRIVATE)


def key_to_bytes(key: str) -> bytes:
    """The inverse of `key_from_bytes`: the exact bytes of the relative path a key names."""
    return key.translate(_TO_SURROGATE).encode("utf-8", "surrogateescape")


@lru_cache(maxsize=4096)
def _owner(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class FsConnector:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        self.problems = ListingProblems()

    def check(self) -> None:
        if not self.root.is_dir():
            raise SourceUnavailable(f"source root {self.root} is not a readable directory")
        try:
            os.scandir(self.root).close()
        except OSError as exc:
            raise SourceUnavailable(f"source root {self.root} cannot be listed: {exc.strerror}") from exc

    def walk(self) -> Iterator[FileMeta]:
        self.check()
        seen_dirs: set[tuple[int, int]] = set()
        stack = [self.root]
        while stack:
            directory = stack.pop()
            try:
                dst = directory.stat()
            except OSError as exc:
                self.problems.add(self._key(directory), f"cannot stat directory: {exc.strerror}")
                continue
            ident = (dst.st_dev, dst.st_ino)
            if ident in seen_dirs:
                self.problems.add(self._key(directory), "directory loop (symlink to an ancestor) skipped")
                continue
            seen_dirs.add(ident)
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError as exc:
                self.problems.add(self._key(directory), f"cannot list directory: {exc.strerror}")
                continue
            subdirs = []
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=True)
                except OSError as exc:
                    self.problems.add(self._key(Path(entry.path)), f"cannot stat: {exc.strerror}")
                    continue
                if stat.S_ISDIR(st.st_mode):
                    subdirs.append(Path(entry.path))
                elif stat.S_ISREG(st.st_mode):
                    yield FileMeta(
                        key=self._key(Path(entry.path)), size=st.st_size,
                        mtime=datetime.fromtimestamp(st.st_mtime, UTC),
                        owner=_owner(st.st_uid), mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
                    )
            stack.extend(reversed(subdirs))

    def _key(self, path: Path) -> str:
        try:
            relative = path.relative_to(self.root).as_posix()
        except ValueError:
            relative = str(path)
        return key_from_bytes(os.fsencode(relative))

    def resolve(self, key: str) -> Path:
        """The absolute path of a key (its exact on-disk bytes), refusing anything that escapes the root."""
        path = Path(os.path.normpath(self.root / os.fsdecode(key_to_bytes(key))))
        if path == self.root or self.root not in path.parents:
            raise FileNotFoundError(key)
        return path

    def open(self, key: str) -> BinaryIO:
        return open(self.resolve(key), "rb")  # noqa: SIM115 - the caller closes it
