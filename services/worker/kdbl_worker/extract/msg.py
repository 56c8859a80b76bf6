"""Outlook .msg via olefile (BSD): the MAPI property streams of the OLE2 container.

Same Blocks as eml.py: headers (From/To/Cc/Date/Subject), the body (plain text, else
HTML through the HTML extractor), an "Attachments:" list. Reads [MS-OXMSG] directly
instead of using extract-msg, which is GPL-3.0 and pulls in a dozen packages.
S/MIME-encrypted messages fail as encrypted; RTF-only bodies are not decoded.
"""

from __future__ import annotations

import codecs
import datetime as dt
import io
import struct
from email.utils import format_datetime

import olefile

from kdbl_worker.extract.archive import ENCRYPTED, is_ole2
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.html import extract_html
from kdbl_worker.extract.text import paragraphs

# MAPI property ids ([MS-OXPROPS]); strings live in __substg1.0_<id><type> streams
MESSAGE_CLASS = 0x001A
SUBJECT = 0x0037
SUBMIT_TIME = 0x0039
SENDER_NAME = 0x0C1A
SENDER_EMAIL = 0x0C1F
DISPLAY_CC = 0x0E03
DISPLAY_TO = 0x0E04
DELIVERY_TIME = 0x0E06
ATTACH_SIZE = 0x0E20
BODY = 0x1000
RTF_COMPRESSED = 0x1009
HTML_BODY = 0x1013
ATTACH_DISPLAY = 0x3001
ATTACH_DATA = 0x3701
ATTACH_NAME = 0x3704
ATTACH_LONG_NAME = 0x3707
ATTACH_MIME = 0x370E
INTERNET_CPID = 0x3FDE
MESSAGE_CPID = 0x3FFD
SENDER_SMTP = 0x5D01
PT_LONG, PT_SYSTIME = 0x0003, 0x0040
_FILETIME_EPOCH = dt.datetime(1601, 1, 1, tzinfo=dt.UTC)


class _Storage:
    """One property-bearing storage: the message itself or an attachment."""

    def __init__(
        self, ole: olefile.OleFileIO, prefix: str, header_size: int, codepage: str = "cp1252"
    ) -> None:
        self.ole, self.prefix, self.codepage = ole, prefix, codepage
        self.fixed: dict[int, bytes] = {}
        path = prefix + "__properties_version1.0"
        if ole.exists(path):
            data = ole.openstream(path).read()
            for offset in range(header_size, len(data) - 15, 16):
                tag, _flags, value = struct.unpack_from("<II8s", data, offset)
                self.fixed[tag] = value

    def string(self, prop_id: int) -> str:
        for suffix, encoding in (("001F", "utf-16-le"), ("001E", self.codepage)):
            path = f"{self.prefix}__substg1.0_{prop_id:04X}{suffix}"
            if self.ole.exists(path):
                return (
                    self.ole.openstream(path).read().decode(encoding, errors="replace").rstrip("\x00").strip()
                )
        return ""

    def binary(self, prop_id: int) -> bytes | None:
        path = f"{self.prefix}__substg1.0_{prop_id:04X}0102"
        return self.ole.openstream(path).read() if self.ole.exists(path) else None

    def binary_size(self, prop_id: int) -> int | None:
        path = f"{self.prefix}__substg1.0_{prop_id:04X}0102"
        return self.ole.get_size(path) if self.ole.exists(path) else None

    def long(self, prop_id: int) -> int | None:
        value = self.fixed.get(prop_id << 16 | PT_LONG)
        return struct.unpack_from("<i", value)[0] if value is not None else None

    def time(self, prop_id: int) -> dt.datetime | None:
        value = self.fixed.get(prop_id << 16 | PT_SYSTIME)
        if value is None:
            return None
        ticks = struct.unpack_from("<Q", value)[0]
        try:
            return _FILETIME_EPOCH + dt.timedelta(microseconds=ticks // 10)
        except OverflowError:
            return None


def _codepage(message: _Storage) -> str:
    for prop_id in (INTERNET_CPID, MESSAGE_CPID):
        number = message.long(prop_id)
        if number and number not in (1200, 65001):  # UTF-16/UTF-8 cpids: 8-bit strings are rare then
            try:
                return codecs.lookup(f"cp{number}").name
            except LookupError:
                continue
    return "cp1252"


def _headers(message: _Storage) -> list[str]:
    sender = message.string(SENDER_NAME)
    address = message.string(SENDER_SMTP) or message.string(SENDER_EMAIL)
    if address and "@" in address and address != sender:
        sender = f"{sender} <{address}>" if sender else address
    sent = message.time(SUBMIT_TIME) or message.time(DELIVERY_TIME)
    values = {
        "From": sender,
        "To": message.string(DISPLAY_TO),
        "Cc": message.string(DISPLAY_CC),
        "Date": format_datetime(sent) if sent else "",
        "Subject": message.string(SUBJECT),
    }
    return [f"{name}: {' '.join(value.split())}" for name, value in values.items() if value]


def _attachments(ole: olefile.OleFileIO, codepage: str) -> list[str]:
    names = sorted(
        {
            entry[0]
            for entry in ole.listdir(streams=False, storages=True)
            if entry and entry[0].startswith("__attach_version1.0_#")
        }
    )
    lines = []
    for number, storage_name in enumerate(names, start=1):
        attachment = _Storage(ole, storage_name + "/", header_size=8, codepage=codepage)
        name = (
            attachment.string(ATTACH_LONG_NAME)
            or attachment.string(ATTACH_NAME)
            or attachment.string(ATTACH_DISPLAY)
            or f"attachment {number}"
        )
        mime = attachment.string(ATTACH_MIME) or "application/octet-stream"
        size = attachment.binary_size(ATTACH_DATA)
        if size is None:
            size = attachment.long(ATTACH_SIZE) or 0
        lines.append(f"{' '.join(name.split())} ({mime}, {size} bytes)")
    return lines


def extract_msg(source: Source) -> Extraction:
    if not is_ole2(source.stream):
        return Extraction.failed("not an Outlook message (not an OLE2 compound file)")
    with olefile.OleFileIO(source.stream) as ole:
        if not ole.exists("__properties_version1.0") and not ole.exists("__substg1.0_0037001F"):
            if ole.exists("EncryptedPackage"):
                return Extraction.failed(ENCRYPTED)
            return Extraction.failed("not an Outlook message (no MAPI property streams)")
        message = _Storage(ole, "", header_size=32)
        message.codepage = _codepage(message)
        message_class = message.string(MESSAGE_CLASS)
        if message_class.upper().startswith("IPM.NOTE.SMIME") and "SIGNED" not in message_class.upper():
            return Extraction.failed(ENCRYPTED)
        blocks = [Block("\n".join(header))] if (header := _headers(message)) else []
        problem = None
        body = message.string(BODY)
        if body:
            blocks.extend(paragraphs(body.replace("\r\n", "\n")))
        elif html := message.binary(HTML_BODY) or message.string(HTML_BODY).encode("utf-8"):
            blocks.extend(extract_html(Source(io.BytesIO(html), "body.html", len(html), "text/html")).blocks)
        elif message.binary_size(RTF_COMPRESSED):
            problem = "body only in compressed RTF (not decoded)"
        attachments = _attachments(ole, message.codepage)
        if attachments:
            blocks.append(Block("Attachments: " + "; ".join(attachments)))
        title = message.string(SUBJECT) or None
    return Extraction(blocks=blocks, status="partial" if problem else "ok", reason=problem, title=title)
