"""What the legacy Office readers (.doc, .xls, .ppt) share: opening the OLE2 container, its title, and
files that carry a legacy extension but hold another format.

A `.doc` on a real share is often not a Word 97 binary at all: Word's "Save as" writes RTF, HTML
("Web Page") or Word 2003 XML under any name, web applications export HTML tables or tab-separated
text as `.xls`, and a `.docx` renamed to `.doc` is a zip. `misnamed` recognises those by their first
bytes (plain text by the same test as files no format reads) and hands them to the extractor of what
they really are, so the file is indexed instead of failing as "not an OLE2 file".
"""

from __future__ import annotations

import email
import email.policy
import importlib
import io
import struct
from collections.abc import Callable
from typing import BinaryIO

import olefile

from kdbl_worker.extract.archive import OLE2_MAGIC
from kdbl_worker.extract.base import Extraction, Source

_HEAD = 4096
_ZIP = b"PK\x03\x04"
_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")


class OleError(Exception):
    """A container that cannot be read; str() is the status reason."""


def open_ole(stream: BinaryIO) -> olefile.OleFileIO:
    """The OLE2 container of a legacy Office file; OleError for a truncated or corrupt one."""
    stream.seek(0)
    try:
        return olefile.OleFileIO(stream)
    except (OSError, ValueError, IndexError, struct.error) as exc:  # olefile: OSError for a bad header
        raise OleError(f"corrupt OLE2 container: {exc}") from exc


def read_stream(ole: olefile.OleFileIO, name: str) -> bytes:
    """One stream's bytes; OleError when a sector chain points outside the file (a truncated copy)."""
    try:
        with ole.openstream(name) as stream:
            return stream.read()
    except (OSError, ValueError, IndexError, struct.error) as exc:
        raise OleError(f"corrupt OLE2 container: stream {name!r} unreadable ({exc})") from exc


def title(ole: olefile.OleFileIO) -> str | None:
    """The document title from the SummaryInformation property set, when there is one."""
    try:
        raw = ole.get_metadata().title
    except Exception:  # noqa: BLE001 - a damaged property set costs the title, not the text
        return None
    if isinstance(raw, bytes):
        raw = raw.decode("cp1252", errors="replace")
    return " ".join(str(raw or "").replace("\x00", "").split()) or None


# what a file really is, by its first bytes -> (label, content type, extractor target)
_DELEGATES = {
    "rtf": ("RTF", "application/rtf", "rtf:extract_rtf"),
    "html": ("HTML", "text/html", "html:extract_html"),
    "xml": ("XML", "application/xml", "json_xml:extract_xml"),
    "mime": ("MHTML (web archive)", "multipart/related", "ole:extract_mhtml"),
}
_OOXML_TYPE = "application/vnd.openxmlformats-officedocument."
_OOXML = {
    ".doc": ("DOCX", _OOXML_TYPE + "wordprocessingml.document", "docx:extract_docx"),
    ".xls": ("XLSX", _OOXML_TYPE + "spreadsheetml.sheet", "xlsx:extract_xlsx"),
    ".ppt": ("PPTX", _OOXML_TYPE + "presentationml.presentation", "pptx:extract_pptx"),
}


def sniff(head: bytes, legacy: str) -> tuple[str, str, str] | None:
    """(label, content type, target) of the format `head` really is, or None for OLE2 or unknown bytes."""
    if head.startswith(OLE2_MAGIC):
        return None
    if head.startswith(_ZIP):
        return _OOXML[legacy]
    text = head
    for bom in _BOMS:
        if text.startswith(bom):
            text = text[len(bom):]
            break
    text = text.lstrip().replace(b"\x00", b"")[:_HEAD].lower()  # UTF-16 markup loses its NULs here
    if text.startswith(b"{\\rtf"):
        return _DELEGATES["rtf"]
    if text.startswith(b"mime-version:") or (b"\nmime-version:" in text[:1024] and b"content-type:" in text):
        return _DELEGATES["mime"]
    if b"<html" in text or text.startswith(b"<!doctype html"):
        return _DELEGATES["html"]
    if text.startswith(b"<"):
        return _DELEGATES["xml"]
    return None


def misnamed(source: Source, legacy: str) -> Extraction | None:
    """The extraction of a file with a legacy Office extension that holds another format, else None."""
    source.stream.seek(0)
    head = source.stream.read(_HEAD)
    source.stream.seek(0)
    found = sniff(head, legacy)
    if found is None:
        return None if head.startswith(OLE2_MAGIC) else _as_text(source, legacy)
    label, content_type, target = found
    module_name, func_name = target.split(":")
    extractor = getattr(importlib.import_module("kdbl_worker.extract." + module_name), func_name)
    result = extractor(source)
    result.content_type = result.content_type or content_type
    if result.status == "ok" and not result.reason:
        result.reason = f"{label} content in a {legacy} file"
    return result


def _as_text(source: Source, legacy: str) -> Extraction | None:
    """Text under a legacy name: Excel's "Unicode Text" (UTF-16, tab-separated) or a CSV export saved as
    .xls (read as delimited rows), a .doc saved as plain text. None when the bytes are binary."""
    from kdbl_worker.extract.code import extract_unknown

    result = extract_unknown(source)  # the same text-or-binary judgement as for files no format reads
    source.stream.seek(0)
    if result.status == "skipped":
        return None
    label = "plain text"
    if legacy == ".xls":
        from kdbl_worker.extract.csv import extract_csv

        result, label = extract_csv(source), "delimited text"
        result.content_type = result.content_type or "text/csv"
    if result.status == "ok":
        result.reason = f"{label} content in a {legacy} file" + (f" ({result.reason})" if result.reason else "")
    return result


def extract_mhtml(source: Source) -> Extraction:
    """Word's "Single File Web Page" (MHTML) under a .doc name: the text of its first HTML part."""
    from kdbl_worker.extract.html import extract_html

    message = email.message_from_binary_file(source.stream, policy=email.policy.default)
    part = next((p for p in message.walk() if p.get_content_type() == "text/html"), None)
    if part is None:
        return Extraction.failed("web archive without an HTML part")
    try:
        html = part.get_content().encode("utf-8")
    except (LookupError, ValueError, AttributeError) as exc:  # an unknown charset, a broken transfer encoding
        return Extraction.failed(f"web archive HTML part unreadable: {exc}")
    return extract_html(Source(io.BytesIO(html), source.name + ".html", len(html)))


def not_ole2(what: str) -> Extraction:
    """`what` with its article: "a Word 97-2003"."""
    return Extraction.failed(f"not {what} file (no OLE2 header; not RTF, HTML, XML, a zip or text either)")


def read_legacy(source: Source, legacy: str, what: str, content_type: str,
                read: Callable[[Source], Extraction]) -> Extraction:
    """The common front of the .doc/.xls/.ppt readers: a misnamed file (RTF, HTML, XML, zip, text) goes to its
    own extractor, a file without the OLE2 header fails with the reason, else `read` parses the compound file.
    The content type is set here, not by the table, because a legacy file under an OOXML name comes here too."""
    result = misnamed(source, legacy)
    if result is None:
        source.stream.seek(0)
        result = read(source) if source.stream.read(8) == OLE2_MAGIC else not_ole2(what)
    result.content_type = result.content_type or content_type
    return result
