"""7z archive members for extract/containers.py, via py7zr (LGPL-2.1+, pure Python plus small C
codecs, maintained: 1.1.4 of October 2026; the `archives` extra, so a lean install has no .7z).

7z compresses many files as one solid block and stores compressed sizes per block, not per file, so
a member's compressed size is its share of the archive (`packed` = size x archive bytes / all
members' sizes): the bomb check is the archive's own ratio. Members are decompressed in batches of
at most `max_member_bytes` together (a solid block is decompressed again from its start for each
batch: only archives over 64 MiB pay that), each written into a buffer that keeps at most its
declared size + 1 byte, under py7zr's own total limit as a second guard. py7zr's file-writing path
refuses traversal names for the whole archive, so its worker is given in-memory writers directly.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, BinaryIO

from kdbl_worker.extract.archive import ENCRYPTED
from kdbl_worker.extract.containers import Bounds, Entry, Refused


def available() -> bool:
    try:
        import py7zr  # noqa: F401
    except ImportError:
        return False
    return True


class _Batches:
    """Decompresses the wanted members a batch at a time and hands each one out once."""

    def __init__(self, archive: Any, files: list[Any], bounds: Bounds) -> None:
        self.archive, self.files, self.bounds = archive, files, bounds
        self.ready: dict[int, bytes] = {}
        self.broken: str | None = None
        self.declared = sum(f.uncompressed for f in files if not f.emptystream)

    def _writers(self) -> Any:
        from py7zr.io import Py7zIO, WriterFactory

        class Capped(Py7zIO):
            def __init__(self, cap: int) -> None:
                self.cap, self.data = cap, bytearray()

            def write(self, s: bytes | bytearray) -> int:
                room = self.cap + 1 - len(self.data)
                if room > 0:
                    self.data += s[:room]
                return len(s)

            def read(self, size: int | None = None) -> bytes:
                return b""

            def seek(self, offset: int, whence: int = 0) -> int:
                return 0

            def flush(self) -> None:
                return None

            def size(self) -> int:
                return len(self.data)

        class Factory(WriterFactory):
            def __init__(self) -> None:
                self.products: dict[str, Capped] = {}

            def create(self, filename: str) -> Capped:
                self.products[filename] = Capped(int(filename.split(":")[1]))
                return self.products[filename]

        return Factory()

    def read(self, position: int, limit: int) -> bytes:
        if self.broken is not None:  # decompressing again from the start would fail again: n tries, n^2 work
            raise Refused(self.broken)
        if position not in self.ready:
            try:
                self._batch(position, limit)
            except Refused as exc:
                self.broken = str(exc)
                raise
        return self.ready.pop(position)

    def _batch(self, position: int, limit: int) -> None:
        from py7zr.io import MemIO

        wanted, total = {}, 0
        for index in range(position, len(self.files)):
            entry = self.files[index]
            if entry.is_directory or entry.is_symlink or entry.emptystream:
                continue
            cap = min(entry.uncompressed, limit) if index == position else entry.uncompressed
            if wanted and total + cap > self.bounds.max_member_bytes:
                break
            wanted[entry.id], total = (index, cap), total + cap
        factory = self._writers()
        self.ready.clear()
        worker = self.archive.worker
        for entry in self.archive.files:
            target = wanted.get(entry.id)
            worker.register_filelike(entry.id, MemIO(f"{entry.id}:{target[1]}", factory) if target else None)
        # counts what it skips too: a backstop against sizes that lie, the capped writers bound memory
        worker.max_extract_size = self.declared + (1 << 20)
        try:
            worker.extract(self.archive.fp, None, parallel=False)
        except Exception as exc:  # noqa: BLE001 - py7zr's CRC, codec and bomb errors alike
            raise Refused(f"corrupt member: {type(exc).__name__}: {str(exc)[:200]}") from exc
        finally:
            self.archive.reset()
        for name, product in factory.products.items():
            self.ready[wanted[int(name.split(":")[0])][0]] = bytes(product.data)
        for index, _ in wanted.values():
            self.ready.setdefault(index, b"")


NOT_INSTALLED = "py7zr is not installed (pip install 'kdbl-context-lake[archives]')"


def sevenzip_entries(stream: BinaryIO, bounds: Bounds, problems: list[str]) -> Iterator[Entry]:
    try:
        import py7zr
    except ImportError as exc:
        raise ImportError(NOT_INSTALLED) from exc

    stream.seek(0, 2)
    archive_bytes = stream.tell()
    stream.seek(0)
    if not isinstance(stream, io.IOBase):  # py7zr takes only io objects (a connector may give another kind)
        stream = io.BytesIO(stream.read())
    try:
        archive = py7zr.SevenZipFile(stream, mode="r")
    except py7zr.PasswordRequired as exc:
        raise Refused(f"encrypted archive ({ENCRYPTED}): its member names are encrypted too") from exc
    with archive:
        files = list(archive.files)
        encrypted = archive.needs_password()
        total = sum(f.uncompressed for f in files if not f.emptystream) or 1
        batches = _Batches(archive, files, bounds)
        for index, entry in enumerate(files):
            if entry.is_directory or entry.is_symlink or entry.is_socket or entry.is_junction:
                yield Entry(entry.filename, 0, regular=False)
                continue
            size = 0 if entry.emptystream else entry.uncompressed
            packed = max(1, size * archive_bytes // total)
            if entry.emptystream:
                yield Entry(entry.filename, 0, lambda limit: b"", packed)
            elif encrypted:
                yield Entry(entry.filename, size, packed=packed, problem=f"encrypted member ({ENCRYPTED})")
            else:
                yield Entry(entry.filename, size, lambda limit, i=index: batches.read(i, limit), packed)
