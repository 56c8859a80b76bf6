"""Zip archive members for extract/containers.py, with the zip guards of extract/archive.py.

The central directory is read first (it is what zipfile trusts): an archive declaring more than
`_MAX_ENTRIES` entries is refused before zipfile builds one ZipInfo per entry (~0.5 KB each).
Overlapping members (the non-recursive bombs) are refused by name. Names not flagged UTF-8 are tried
as UTF-8 (what macOS and Linux zip write without the flag) before cp437 (the zip default), and the
Info-ZIP Unicode Path extra field wins when present and its CRC matches.
"""

from __future__ import annotations

import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from typing import BinaryIO

from kdbl_worker.extract.archive import ENCRYPTED, is_encrypted, overlapping_members
from kdbl_worker.extract.containers import Bounds, Entry, Refused

_MAX_ENTRIES = 200_000
_UTF8_FLAG = 0x800
_UNICODE_PATH = 0x7075
_UNIX = 3
_CHUNK = 256 << 10
_METHODS = {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}


def _declared_entries(stream: BinaryIO) -> int | None:
    try:
        record = zipfile._EndRecData(stream)  # noqa: SLF001 - the one reader of the end record
    except OSError:
        return None
    return record[zipfile._ECD_ENTRIES_TOTAL] if record else None  # noqa: SLF001


def _unicode_path(info: zipfile.ZipInfo, stored: bytes) -> str | None:
    extra = info.extra
    while len(extra) >= 4:
        kind, size = struct.unpack_from("<HH", extra)
        body = extra[4:4 + size]
        if kind == _UNICODE_PATH and len(body) > 5 and body[0] == 1:
            if struct.unpack_from("<I", body, 1)[0] == zlib.crc32(stored):
                return body[5:].decode("utf-8", "replace")
        extra = extra[4 + size:]
    return None


def stored_name(info: zipfile.ZipInfo) -> str:
    """The member name as its author meant it (before containers.member_path makes it safe)."""
    if info.flag_bits & _UTF8_FLAG:
        return info.orig_filename
    stored = info.orig_filename.encode("cp437")
    if unicode := _unicode_path(info, stored):
        return unicode
    try:
        return stored.decode("utf-8")
    except UnicodeDecodeError:
        return info.orig_filename


def _regular(info: zipfile.ZipInfo) -> bool:
    if info.is_dir():
        return False
    kind = stat.S_IFMT(info.external_attr >> 16)  # 0 when the writer set no file type
    return not (info.create_system == _UNIX and kind and kind != stat.S_IFREG)


def _reader(package: zipfile.ZipFile, info: zipfile.ZipInfo):
    def read(limit: int) -> bytes:
        out = bytearray()
        try:
            with package.open(info) as member:
                while len(out) <= limit and (chunk := member.read(min(_CHUNK, limit + 1 - len(out)))):
                    out += chunk
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError, ValueError) as exc:
            raise Refused(f"corrupt member: {type(exc).__name__}: {str(exc)[:200]}") from exc
        return bytes(out)

    return read


def zip_entries(stream: BinaryIO, bounds: Bounds, problems: list[str]) -> Iterator[Entry]:
    declared = _declared_entries(stream)
    if declared is not None and declared > _MAX_ENTRIES:
        raise Refused(f"zip bomb refused: {declared} entries declared "
                      f"(more than {_MAX_ENTRIES} are not read)")
    stream.seek(0)
    package = zipfile.ZipFile(stream)
    overlapped = set(overlapping_members(package))
    if overlapped:
        problems.append(f"zip bomb refused: {len(overlapped)} members overlap other members' data")
    for info in package.infolist():
        if not _regular(info):
            yield Entry(info.orig_filename, info.file_size, regular=False)
            continue
        problem = None
        if info.orig_filename in overlapped:
            problem = "zip bomb refused: member overlaps another member's data"
        elif is_encrypted(info):
            problem = f"encrypted member ({ENCRYPTED})"
        elif info.compress_type not in _METHODS:
            problem = f"unsupported compression method {info.compress_type}"
        yield Entry(stored_name(info), info.file_size, _reader(package, info), info.compress_size,
                    problem=problem)
