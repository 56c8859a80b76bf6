"""POSIX / NFS mounts: recursive listing with size, mtime, owner, mode, uid and gid.

Symlinks to files are followed; directory loops (a symlink to an ancestor) and unreadable
entries are recorded in `problems` and skipped, never fatal.
"""

from __future__ import annotations

import logging
import os
import pwd
import stat
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO

from kdbl_worker.connectors import ListingProblems, RemoteFile, SourceUnavailable

__all__ = ["FsConnector", "SourceUnavailable"]

log = logging.getLogger(__name__)


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

    def walk(self) -> Iterator[RemoteFile]:
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
                    key = self._key(Path(entry.path))
                    try:
                        key.encode("utf-8")
                    except UnicodeEncodeError:
                        self.problems.add(repr(entry.path), "file name is not valid UTF-8; skipped")
                        continue
                    yield RemoteFile(
                        key=key, size=st.st_size, mtime=datetime.fromtimestamp(st.st_mtime, UTC),
                        owner=_owner(st.st_uid), mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid,
                    )
            stack.extend(reversed(subdirs))

    def _key(self, path: Path) -> str:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def resolve(self, key: str) -> Path:
        """The absolute path of a key, refusing anything that escapes the root."""
        path = Path(os.path.normpath(self.root / key))
        if path == self.root or self.root not in path.parents:
            raise FileNotFoundError(key)
        return path

    def open(self, key: str) -> BinaryIO:
        return open(self.resolve(key), "rb")  # noqa: SIM115 - the caller closes it
