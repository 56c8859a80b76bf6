"""A single compressed file (`notes.txt.gz`, `changelog.Debian.gz`, `app.log.1.bz2`, `dump.sql.xz`): its
text is the text of the file inside, read by the extractor of the name without the compression suffix.

Real shares hold many of these: rotated logs, and in a sample of /usr/share/doc 387 of 1,343 files were
gzip-compressed changelogs and manuals. They are transparent, not containers: one file, one row, the
download is the compressed file itself; archives (`.tar.gz`, `.tgz`) are containers (extract/containers.py)
and never come here.

A compressed file is a bomb as easily as an archive member, so it gets the same bounds (`Source.bounds`,
the KDBL_CONTAINER_* settings; `Source.budget`, shared with every level of its top-level file when it is a
member itself). Decompression is streamed and counted on both sides, never done whole first:
- more than `max_ratio` times the compressed bytes read so far (beyond the 1 MiB floor; the count
  includes the decompressor's read-ahead, so it errs low) is refused as a bomb (`skipped`, with the
  reason) while reading;
- past `max_member_bytes` or the top-level file's expanded-bytes budget, a text-like file is indexed up to
  the bound (`partial`, with the reason) and any other format is refused;
- the bytes read are charged to the budget.

Before these bounds, a 786-byte .bz2, a 39 KB .xz and a 1 MB .gz each became 64 MiB of text (37,283
chunks) where the same content in a .zip, .tar.gz or .7z is refused by ratio. Measured now (2 cores): 64 MiB
of one log line as a 15 KB .bz2 or a 10 KB .xz is refused after inflating 1.8 MiB, in 30 ms and 3 ms; 1 GiB
of it as a 3.1 MB .gz after 3.5 MiB, in 5 ms.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import PurePosixPath
from typing import BinaryIO

from kdbl_worker.extract import formats
from kdbl_worker.extract.archive import CountedReader, ratio_exceeded
from kdbl_worker.extract.base import Extraction, Source
from kdbl_worker.extract.containers import RATIO_FLOOR, Bounds, Budget

_CHUNK = 256 << 10
_OPENERS = {".gz": (lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), "gzip"),
            ".bz2": (lambda raw: bz2.BZ2File(raw, mode="rb"), "bzip2"),
            ".xz": (lambda raw: lzma.LZMAFile(raw, mode="rb"), "xz")}
_TEXT_TARGETS = {formats.TEXT, formats.CODE, formats.SNIFF}


class _Bomb(Exception):
    """str() is the reason the file is refused."""


def _mib(size: int) -> str:
    return f"{size / (1 << 20):.0f} MiB" if size >= 10 << 20 else f"{size / (1 << 20):.1f} MiB"


def _inflate(source: Source, opener, kind: str, limit: int, max_ratio: int) -> tuple[bytes, bool]:
    """(data, cut): at most `limit` bytes of the decompressed stream, and whether there was more. Raises
    _Bomb once the bytes inflated pass `max_ratio` times the compressed bytes read meanwhile."""
    out = bytearray()
    counted = CountedReader(source.stream)
    with opener(counted) as stream:
        while len(out) <= limit:
            piece = stream.read(min(_CHUNK, limit + 1 - len(out)))
            if not piece:
                return bytes(out), False
            out += piece
            # counted: what the decompressor took, its read-ahead included (so the ratio errs low)
            if ratio_exceeded(len(out), counted.count, max_ratio, RATIO_FLOOR):
                raise _Bomb(f"{kind} bomb refused: more than {_mib(len(out))} inflated from at most "
                            f"{counted.count} bytes compressed (ratio > {max_ratio}, as for archive members)")
    return bytes(out[:limit]), True


def extract_compressed(source: Source) -> Extraction:
    from kdbl_worker import extract  # the dispatcher; imported here to avoid a cycle

    suffix = PurePosixPath(source.name).suffix.lower()
    opener, kind = _OPENERS[suffix]
    inner_name = source.name[: -len(suffix)]
    inner_type, target = extract.detect(inner_name)
    text_like = (target or formats.SNIFF) in _TEXT_TARGETS
    bounds = source.bounds if source.bounds is not None else Bounds()
    budget = source.budget if source.budget is not None else Budget()
    limit = min(bounds.max_member_bytes, budget.bytes_left(bounds))
    why = ("KDBL_CONTAINER_MAX_MEMBER_BYTES" if limit == bounds.max_member_bytes
           else "KDBL_CONTAINER_MAX_EXPANDED_BYTES, for the file and all it holds")
    try:
        data, cut = _inflate(source, opener, kind, limit, bounds.max_ratio)
    except _Bomb as exc:
        return Extraction.skipped(str(exc))
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as exc:
        return Extraction.failed(f"corrupt {kind} data: {exc}")
    budget.bytes += len(data)
    if cut and not data:
        return Extraction.skipped(f"expanded size cap reached ({_mib(bounds.max_expanded_bytes)} per file, all "
                                  "levels together; KDBL_CONTAINER_MAX_EXPANDED_BYTES); not indexed")
    if cut and not text_like:
        return Extraction.skipped(f"{kind} file expands to more than {_mib(limit)}; not indexed ({why})")
    inner = extract.extract(Source(io.BytesIO(data), PurePosixPath(inner_name).name, len(data), inner_type,
                                   bounds=bounds, budget=budget))
    notes = [f"{kind}-compressed {inner.content_type or inner_type or 'data'} ({len(data)} bytes expanded)"]
    if cut:
        notes.append(f"only the first {_mib(limit)} of the decompressed text indexed ({why})")
        if inner.status == "ok":
            inner.status = "partial"
    if inner.reason:
        notes.append(inner.reason)
    inner.reason = "; ".join(notes)
    inner.content_type = None  # the file's own type (the compressed one) stays its content type
    return inner
