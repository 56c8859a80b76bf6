"""A single compressed file (`notes.txt.gz`, `changelog.Debian.gz`, `app.log.1.bz2`, `dump.sql.xz`): its
text is the text of the file inside, read by the extractor of the name without the compression suffix.

Real shares hold many of these: rotated logs, and in a sample of /usr/share/doc 387 of 1,343 files were
gzip-compressed changelogs and manuals. They are transparent, not containers: one file, one row, the
download is the compressed file itself; archives (`.tar.gz`, `.tgz`) are containers (extract/containers.py)
and never come here. Decompression is streamed and bounded (`MAX_EXPANDED`, the container member limit):
a text-like file past it is indexed up to the limit (`partial`, with the reason); any other format past it
is refused, so a gzip bomb costs one bounded read.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from pathlib import PurePosixPath

from kdbl_worker.extract import formats
from kdbl_worker.extract.base import Extraction, Source
from kdbl_worker.extract.containers import Bounds

MAX_EXPANDED = Bounds().max_member_bytes  # 64 MiB, as one archive member
_CHUNK = 1 << 20
_OPENERS = {".gz": (lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), "gzip"), ".bz2": (bz2.BZ2File, "bzip2"), ".xz": (lzma.LZMAFile, "xz")}
_TEXT_TARGETS = {formats.TEXT, formats.CODE, formats.SNIFF}


def _inflate(source: Source, opener, limit: int) -> tuple[bytes, bool]:
    """(data, cut): at most `limit` bytes of the decompressed stream, and whether there was more."""
    out = bytearray()
    with opener(source.stream) as stream:
        while len(out) <= limit:
            piece = stream.read(min(_CHUNK, limit + 1 - len(out)))
            if not piece:
                return bytes(out), False
            out += piece
    return bytes(out[:limit]), True


def extract_compressed(source: Source) -> Extraction:
    from kdbl_worker import extract  # the dispatcher; imported here to avoid a cycle

    suffix = PurePosixPath(source.name).suffix.lower()
    opener, kind = _OPENERS[suffix]
    inner_name = source.name[: -len(suffix)]
    inner_type, target = extract.detect(inner_name)
    text_like = (target or formats.SNIFF) in _TEXT_TARGETS
    try:
        data, cut = _inflate(source, opener, MAX_EXPANDED)
    except (OSError, EOFError, lzma.LZMAError, zlib.error, ValueError) as exc:
        return Extraction.failed(f"corrupt {kind} data: {exc}")
    if cut and not text_like:
        return Extraction.skipped(f"{kind} file expands to more than {MAX_EXPANDED >> 20} MiB; not indexed "
                                  "(KDBL_CONTAINER_MAX_MEMBER_BYTES)")
    inner = extract.extract(Source(io.BytesIO(data), PurePosixPath(inner_name).name, len(data), inner_type))
    notes = [f"{kind}-compressed {inner.content_type or inner_type or 'data'} ({len(data)} bytes expanded)"]
    if cut:
        notes.append(f"only the first {MAX_EXPANDED >> 20} MiB of the decompressed text indexed")
        if inner.status == "ok":
            inner.status = "partial"
    if inner.reason:
        notes.append(inner.reason)
    inner.reason = "; ".join(notes)
    inner.content_type = None  # the file's own type (the compressed one) stays its content type
    return inner
