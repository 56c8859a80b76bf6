"""E-mail attachments (.eml, .msg) as container members for extract/containers.py.

Members are named `attachments/<file name>` (slashes in the name become `_`; no name: `attachment N`
with the extension of its MIME type). The parts that are the message's body are not members: the
same `iter_attachments()` that eml.py lists under "Attachments:" decides. An attached e-mail is a
member `attachments/<name>.eml`, so its own attachments are the next level down:
- .eml: a message/rfc822 part is that message's bytes as they were sent;
- .msg: an attached Outlook message (an embedded MAPI storage, PR_ATTACH_METHOD 5) has no bytes of
  its own, so it becomes an RFC 822 message built from its headers, body and attachments (what its
  download gives); OLE objects (method 6) and attachments by reference (2-4) have no data to index.
"""

from __future__ import annotations

import mimetypes
import re
from collections.abc import Iterator
from email import policy
from email.message import EmailMessage, Message
from email.parser import BytesParser
from typing import BinaryIO

import olefile

from kdbl_worker.extract.containers import Entry
from kdbl_worker.extract.eml import message_bytes
from kdbl_worker.extract.msg import (
    ATTACH_DATA,
    ATTACH_DISPLAY,
    ATTACH_LONG_NAME,
    ATTACH_MIME,
    ATTACH_NAME,
    BODY,
    HTML_BODY,
    _codepage,
    _headers,
    _Storage,
)

FOLDER = "attachments/"
ATTACH_METHOD = 0x3705
EMBEDDED_MESSAGE = "__substg1.0_3701000D"  # PT_OBJECT storage: an attached message or OLE object
METHOD_EMBEDDED, METHOD_OLE = 5, 6
MAX_EMBEDDED_DEPTH = 8  # an attached .msg inside an attached .msg ... rebuilt this deep, listed below
_UNSAFE = re.compile(r"[/\\\x00-\x1f\x7f]")


def attachment_name(name: str | None, number: int, content_type: str) -> str:
    """One path part: the sender's file name made safe, else `attachment N` + the type's extension."""
    clean = " ".join(_UNSAFE.sub("_", name or "").split())
    if not clean.strip("."):
        clean = f"attachment {number}{mimetypes.guess_extension(content_type) or ''}"
    if content_type == "message/rfc822" and not clean.lower().endswith((".eml", ".msg")):
        clean += ".eml"
    return clean


def _data_reader(data: bytes):
    return lambda limit: data[: limit + 1]


# --- .eml ------------------------------------------------------------------------------------------


def _part_bytes(part: Message) -> bytes:
    if part.get_content_type() == "message/rfc822" and part.is_multipart():
        inner = part.get_payload(0)
        return inner.as_bytes(policy=policy.SMTP) if isinstance(inner, Message) else b""
    return part.get_payload(decode=True) or b""


def eml_entries(stream: BinaryIO) -> Iterator[Entry]:
    stream.seek(0)
    data, _ = message_bytes(stream.read())  # a message saved whole as UTF-16 has attachments too
    message = BytesParser(policy=policy.default).parsebytes(data)
    for number, part in enumerate(message.iter_attachments(), start=1):
        yield _guarded(_eml_entry, number, part, number)


def _eml_entry(part: Message, number: int) -> Entry:
    content_type = part.get_content_type()
    filename = part.get_filename()
    if filename is None and content_type == "message/rfc822" and part.is_multipart():
        inner = part.get_payload(0)
        filename = str(inner.get("Subject", "") or "") if isinstance(inner, Message) else None
    data = _part_bytes(part)
    return Entry(FOLDER + attachment_name(filename, number, content_type), len(data), _data_reader(data))


def _guarded(read, number: int, *args) -> Entry:
    """One attachment; one that cannot be decoded is a refused member, the others still come."""
    try:
        return read(*args)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed part or property stream
        return Entry(FOLDER + f"attachment {number}", 0,
                     problem=f"attachment unreadable: {type(exc).__name__}: {str(exc)[:200]}")


# --- .msg ------------------------------------------------------------------------------------------


def _attachment_storages(ole: olefile.OleFileIO, prefix: str) -> list[str]:
    """The attachment storages directly under `prefix` ('' for the message, 'x/y/' for an embedded one)."""
    depth = prefix.count("/")
    parts = prefix.split("/")[:-1]
    names = {
        entry[depth]
        for entry in ole.listdir(streams=False, storages=True)
        if len(entry) > depth and entry[:depth] == parts and entry[depth].startswith("__attach_version1.0_#")
    }
    return [prefix + name + "/" for name in sorted(names)]


def _name(attachment: _Storage) -> str | None:
    return (attachment.string(ATTACH_LONG_NAME) or attachment.string(ATTACH_NAME)
            or attachment.string(ATTACH_DISPLAY) or None)


def _as_eml(ole: olefile.OleFileIO, prefix: str, codepage: str, level: int) -> bytes:
    """An embedded Outlook message as RFC 822 bytes: its headers, body and (recursively) attachments."""
    message = _Storage(ole, prefix, header_size=24, codepage=codepage)
    message.codepage = _codepage(message) if message.fixed else codepage
    out = EmailMessage()
    for line in _headers(message):
        name, _, value = line.partition(": ")
        out.set_raw(name, value)  # as Outlook shows it: not re-rendered as an address list
    body = message.string(BODY)
    html = message.binary(HTML_BODY) or message.string(HTML_BODY).encode("utf-8")
    if body or not html:
        out.set_content(body.replace("\r\n", "\n") or "\n")
    else:
        out.set_content(html.decode("utf-8", "replace"), subtype="html")
    for number, storage in enumerate(_attachment_storages(ole, prefix), start=1):
        attachment = _Storage(ole, storage, header_size=8, codepage=message.codepage)
        name = _name(attachment)
        if ole.exists(storage + EMBEDDED_MESSAGE) and level < MAX_EMBEDDED_DEPTH:
            inner = _as_eml(ole, storage + EMBEDDED_MESSAGE + "/", message.codepage, level + 1)
            filename = attachment_name(name, number, "message/rfc822")
            out.add_attachment(inner, "message", "rfc822", filename=filename)
            continue
        data = attachment.binary(ATTACH_DATA)
        if data is not None:
            mime = attachment.string(ATTACH_MIME) or "application/octet-stream"
            maintype, _, subtype = mime.partition("/")
            if maintype == "text":
                maintype, subtype = "application", "octet-stream"  # keep its bytes as they are
            out.add_attachment(data, maintype, subtype or "octet-stream",
                               filename=attachment_name(name, number, f"{maintype}/{subtype}"))
    return out.as_bytes(policy=policy.SMTP)


def msg_entries(stream: BinaryIO) -> Iterator[Entry]:
    stream.seek(0)
    with olefile.OleFileIO(stream) as ole:
        message = _Storage(ole, "", header_size=32)
        codepage = _codepage(message)
        for number, storage in enumerate(_attachment_storages(ole, ""), start=1):
            yield _guarded(_msg_entry, number, ole, storage, number, codepage)


def _msg_entry(ole: olefile.OleFileIO, storage: str, number: int, codepage: str) -> Entry:
    attachment = _Storage(ole, storage, header_size=8, codepage=codepage)
    name = _name(attachment)
    method = attachment.long(ATTACH_METHOD)
    mime = attachment.string(ATTACH_MIME) or "application/octet-stream"
    if ole.exists(storage + EMBEDDED_MESSAGE) and method != METHOD_OLE:
        data = _as_eml(ole, storage + EMBEDDED_MESSAGE + "/", codepage, 1)
        return Entry(FOLDER + attachment_name(name, number, "message/rfc822"), len(data), _data_reader(data))
    path = FOLDER + attachment_name(name, number, mime)
    if method == METHOD_OLE:
        return Entry(path, 0, problem="embedded OLE object (not extracted)")
    if (data := attachment.binary(ATTACH_DATA)) is None:
        return Entry(path, 0, problem="attached by reference (no data in the message)")
    return Entry(path, len(data), _data_reader(data))
