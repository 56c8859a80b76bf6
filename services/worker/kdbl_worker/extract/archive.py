"""Shared guards for zip-based formats (OOXML, ODF, EPUB), OLE2 compound files and compressed streams.

Office files are zip packages: before a library inflates one we check the declared
sizes (a zip bomb fails here instead of filling memory) and recognise the OLE2
container that password-protected OOXML files are wrapped in. Streams without declared sizes
(.gz/.bz2/.xz files, tar members) are bounded while they inflate: `CountedReader` counts the
compressed bytes taken, `ratio_exceeded` compares.
"""

from __future__ import annotations

import zipfile
from collections import Counter
from typing import BinaryIO

ENCRYPTED = "encrypted/password-protected"
OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_ENCRYPTED_PACKAGE = "EncryptedPackage".encode("utf-16-le")

MAX_MEMBERS = 20_000
MAX_UNCOMPRESSED = 1 << 30  # 1 GiB declared in total
MAX_RATIO = 200  # per member, once it is bigger than _RATIO_FLOOR
_RATIO_FLOOR = 32 << 20


class PackageError(Exception):
    """A package that must not (or cannot) be opened; str() is the status reason."""


class LegacyBinary(PackageError):
    """A legacy binary Office file (OLE2) under an OOXML name: the .doc/.xls/.ppt reader takes it."""


def is_ole2(stream: BinaryIO) -> bool:
    stream.seek(0)
    head = stream.read(8)
    stream.seek(0)
    return head == OLE2_MAGIC


def ole2_has_encrypted_package(stream: BinaryIO, chunk: int = 1 << 20) -> bool:
    """True when an OLE2 file holds an `EncryptedPackage` stream (a password-protected OOXML file).

    Scans the directory names in chunks rather than parsing the container, so it needs no library.
    """
    stream.seek(0)
    tail = b""
    found = False
    while block := stream.read(chunk):
        if _ENCRYPTED_PACKAGE in tail + block:
            found = True
            break
        tail = block[-len(_ENCRYPTED_PACKAGE) :]
    stream.seek(0)
    return found


def check_ooxml(stream: BinaryIO, legacy_name: str) -> None:
    """Raise PackageError for an encrypted OOXML file, LegacyBinary for a legacy binary file with an OOXML
    extension (the caller hands it to the legacy reader)."""
    if is_ole2(stream):
        if ole2_has_encrypted_package(stream):
            raise PackageError(ENCRYPTED)
        raise LegacyBinary(f"legacy binary Office file ({legacy_name}) under an OOXML name")


def check_zip(stream: BinaryIO) -> zipfile.ZipFile:
    """Open a zip package after checking member count, declared sizes and compression ratios."""
    try:
        package = zipfile.ZipFile(stream)
    except zipfile.BadZipFile as exc:
        raise PackageError(f"not a valid zip package: {exc}") from exc
    members = package.infolist()
    if len(members) > MAX_MEMBERS:
        raise PackageError(f"package has too many members ({len(members)} > {MAX_MEMBERS})")
    if overlapped := overlapping_members(package):
        raise PackageError(f"overlapping members {overlapped[0]!r} (zip bomb?)")
    total = 0
    for info in members:
        total += info.file_size
        if ratio_exceeded(info.file_size, info.compress_size, MAX_RATIO, _RATIO_FLOOR):
            raise PackageError(f"suspicious compression ratio in {info.filename!r} (zip bomb?)")
        if is_encrypted(info):
            raise PackageError(ENCRYPTED)
    if total > MAX_UNCOMPRESSED:
        raise PackageError(
            f"package too large uncompressed ({total >> 20} MiB > {MAX_UNCOMPRESSED >> 20} MiB)"
        )
    return package


class CountedReader:
    """A compressed input that counts the bytes a decompressor took from it (for `ratio_exceeded`)."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw, self.count = raw, 0

    def read(self, size: int = -1) -> bytes:
        data = self.raw.read(size)
        self.count += len(data)
        return data

    def readable(self) -> bool:
        return True


def ratio_exceeded(expanded: int, packed: int, max_ratio: int, floor: int) -> bool:
    """True when `expanded` bytes from `packed` compressed ones is past `max_ratio`, once above `floor`."""
    return expanded > floor and expanded > max_ratio * max(packed, 1)


def is_encrypted(info: zipfile.ZipInfo) -> bool:
    """Traditional PKWARE encryption (flag bit 0) or WinZip AES (compression method 99)."""
    return bool(info.flag_bits & 0x1) or info.compress_type == 99


def overlapping_members(package: zipfile.ZipFile) -> list[str]:
    """Members whose data runs into the next member's local header or the central directory.

    Overlapping entries are how the non-recursive zip bombs (Fifield 2019: 42 kB -> 5.5 GB) reuse one
    compressed kernel for every member; a real zip never has them. A local header is at least 30 bytes.
    """
    starts = sorted({info.header_offset for info in package.infolist()}) + [package.start_dir]
    end_of = dict(zip(starts, starts[1:]))  # a member's data must end before the next header starts
    shared = Counter(info.header_offset for info in package.infolist())
    return [info.orig_filename for info in package.infolist() if shared[info.header_offset] > 1
            or info.header_offset + 30 + info.compress_size > end_of[info.header_offset]]


def read_member(package: zipfile.ZipFile, name: str, limit: int = 256 << 20) -> bytes:
    """Read one member, refusing members over `limit` bytes (declared size; zipfile enforces it)."""
    info = package.getinfo(name)
    if info.file_size > limit:
        raise PackageError(f"{name} too large ({info.file_size >> 20} MiB)")
    return package.read(info)


def guarded_ooxml(stream: BinaryIO, legacy_name: str) -> None:
    """Both OOXML checks; leaves the stream at offset 0 for the library that opens it next."""
    check_ooxml(stream, legacy_name)
    check_zip(stream).close()
    stream.seek(0)
