"""Tar archive members (plain, gzip, bzip2, xz) for extract/containers.py, read as one stream.

The compression is recognised by its magic bytes, not the name. tarfile reads in stream mode ("r|"),
so only the current member is ever in memory; the decompressor sits between two counters:
- a member that inflates more than `max_ratio` times the compressed bytes read meanwhile (beyond the
  1 MiB floor, with 16 KiB of slack for the decompressor's read-ahead) is refused as a bomb and skipped;
- the whole stream stops ("tar bomb refused") once it has inflated past `max_member_bytes` at more
  than `max_ratio`: skipping a refused member still decompresses it, and tarfile reads a pax or GNU
  long-name header whole into memory, so neither may be larger than that.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
from collections.abc import Iterator
from typing import BinaryIO

from kdbl_worker.extract.archive import CountedReader, ratio_exceeded
from kdbl_worker.extract.containers import RATIO_FLOOR, Bounds, Entry, Refused

_SLACK = 16 << 10
_CHUNK = 256 << 10
_MAGIC = {
    b"\x1f\x8b": lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    b"BZh": lambda raw: bz2.BZ2File(raw, mode="rb"),
    b"\xfd7zXZ\x00": lambda raw: lzma.LZMAFile(raw, mode="rb"),
}


class _Guarded:
    """The decompressed stream tarfile reads, refusing to inflate past the bounds."""

    def __init__(self, inner: BinaryIO, counted: CountedReader, bounds: Bounds) -> None:
        self.inner, self.counted, self.bounds, self.count = inner, counted, bounds, 0

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.count += len(data)
        bounds, packed = self.bounds, self.counted.count
        if ratio_exceeded(self.count, packed, bounds.max_ratio, bounds.max_member_bytes):
            raise Refused(f"tar bomb refused: {self.count >> 20} MiB inflated from {packed} bytes "
                          f"(ratio > {self.bounds.max_ratio}); the rest of the archive is not read")
        return data


def _reader(tar: tarfile.TarFile, info: tarfile.TarInfo, counted: CountedReader, bounds: Bounds):
    def read(limit: int) -> bytes:
        member = tar.extractfile(info)
        if member is None:
            raise Refused("no data stored")
        start, out = counted.count, bytearray()
        while len(out) <= limit and (chunk := member.read(min(_CHUNK, limit + 1 - len(out)))):
            out += chunk
            packed = counted.count - start + _SLACK
            if ratio_exceeded(len(out), packed, bounds.max_ratio, RATIO_FLOOR):
                raise Refused(f"zip bomb refused: more than {len(out) >> 20} MiB from about {packed} bytes "
                              f"compressed (ratio > {bounds.max_ratio})")
        return bytes(out)

    return read


def tar_entries(stream: BinaryIO, bounds: Bounds, problems: list[str]) -> Iterator[Entry]:
    stream.seek(0)
    head = stream.read(6)
    stream.seek(0)
    counted = CountedReader(stream)
    opener = next((cls for magic, cls in _MAGIC.items() if head.startswith(magic)), None)
    inner = opener(counted) if opener else counted
    guarded = _Guarded(inner, counted, bounds)
    with tarfile.open(fileobj=guarded, mode="r|") as tar:  # type: ignore[arg-type]
        for info in tar:
            if info.isreg():
                yield Entry(info.name, info.size, _reader(tar, info, counted, bounds))
            else:
                yield Entry(info.name, info.size, regular=False)
