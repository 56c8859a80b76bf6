"""Shared guards for zip-based formats (OOXML, ODF, EPUB) and OLE2 compound files.

Office files are zip packages: before a library inflates one we check the declared
sizes (a zip bomb fails here instead of filling memory) and recognise the OLE2
container that password-protected OOXML files are wrapped in.
"""

from __future__ import annotations

import zipfile
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
    """Raise PackageError for an encrypted OOXML file or a legacy binary file with an OOXML extension."""
    if is_ole2(stream):
        if ole2_has_encrypted_package(stream):
            raise PackageError(ENCRYPTED)
        raise PackageError(f"legacy binary Office file ({legacy_name}), not supported")


def check_zip(stream: BinaryIO) -> zipfile.ZipFile:
    """Open a zip package after checking member count, declared sizes and compression ratios."""
    try:
        package = zipfile.ZipFile(stream)
    except zipfile.BadZipFile as exc:
        raise PackageError(f"not a valid zip package: {exc}") from exc
    members = package.infolist()
    if len(members) > MAX_MEMBERS:
        raise PackageError(f"package has too many members ({len(members)} > {MAX_MEMBERS})")
    total = 0
    for info in members:
        total += info.file_size
        if info.file_size > _RATIO_FLOOR and info.file_size > MAX_RATIO * max(info.compress_size, 1):
            raise PackageError(f"suspicious compression ratio in {info.filename!r} (zip bomb?)")
        if info.flag_bits & 0x1:
            raise PackageError(ENCRYPTED)
    if total > MAX_UNCOMPRESSED:
        raise PackageError(
            f"package too large uncompressed ({total >> 20} MiB > {MAX_UNCOMPRESSED >> 20} MiB)"
        )
    return package


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
