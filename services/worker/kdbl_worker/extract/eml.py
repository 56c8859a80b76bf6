"""E-mail (.eml, RFC 822/MIME) via the stdlib email package.

Blocks: the headers (From/To/Cc/Date/Subject), the body (text/plain preferred, else
HTML through the HTML extractor), and one "Attachments:" block listing name, type and
size. Attachments are listed, not extracted.

Encodings (extract/encoding.py): a message saved whole as UTF-16/UTF-32 (BOM or NUL pattern) is
decoded and parsed as text; a text part's bytes are decoded with its declared charset when that fits,
and by detection when the charset is missing, unknown or wrong (not UTF-8 with replacement). A
detected part encoding or a whole-file one goes in the status reason.
"""

from __future__ import annotations

import codecs
import io
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser
from email.utils import getaddresses

from kdbl_worker.extract import authors
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import SNIFF_BYTES, Decoded, decode
from kdbl_worker.extract.html import extract_html
from kdbl_worker.extract.text import paragraphs

HEADERS = ("From", "To", "Cc", "Date", "Subject")
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
# Defects that lose content (others, like a missing final boundary, are cosmetic).
_LOSSY = {
    "StartBoundaryNotFoundDefect",
    "MultipartInvariantViolationDefect",
    "InvalidBase64CharactersDefect",
    "InvalidBase64LengthDefect",
    "InvalidBase64PaddingDefect",
}


def _header(message: EmailMessage, name: str) -> str:
    try:
        value = message.get(name)
    except (ValueError, IndexError, TypeError):  # a malformed header the policy cannot parse
        raw = message.get_all(name, failobj=[""])
        value = raw[0] if raw else ""
    return " ".join(str(value or "").split())


def part_text(part: EmailMessage) -> Decoded:
    """A text part's payload (transfer encoding undone) decoded: the declared charset when it fits the
    bytes, else detected. `text` is None when the payload is binary."""
    try:
        payload = part.get_payload(decode=True)
    except (LookupError, ValueError, AssertionError):  # a transfer encoding the parser cannot undo
        payload = None
    if not isinstance(payload, bytes):
        return Decoded("")
    return decode(payload, part.get_content_charset())


def body_blocks(message: EmailMessage) -> tuple[list[Block], Decoded | None]:
    """The message body as Blocks (text/plain if present, else text/html converted to text) and how it
    was decoded (None: no body)."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return [], None
    decoded = part_text(part)
    if decoded.text is None:
        return [], decoded
    if part.get_content_subtype() == "html":
        data = decoded.text.encode("utf-8")
        return extract_html(Source(io.BytesIO(data), "body.html", len(data), "text/html")).blocks, decoded
    return paragraphs(decoded.text.replace("\r\n", "\n")), decoded


def _body_note(decoded: Decoded | None) -> str | None:
    """What the status says of the body's encoding: a declared charset that fit is the norm, not news."""
    if decoded is None or decoded.note is None or decoded.note.endswith("(declared)"):
        return None
    return f"body {decoded.note}" if decoded.note.startswith("encoding:") else f"body: {decoded.note}"


def message_bytes(data: bytes) -> tuple[bytes, str | None]:
    """A message saved whole as UTF-16/UTF-32 (or with a UTF-8 BOM) as UTF-8 bytes for the parser, and
    the encoding note (None when the bytes are passed on as they are)."""
    # UTF-32 LE's BOM starts as UTF-16 LE's; UTF-32 BE's starts with NUL
    if not (data.startswith(_BOMS) or b"\x00" in data[:SNIFF_BYTES]):
        return data, None
    decoded = decode(data)
    if decoded.text is None:  # binary: let the parser find no headers
        return data, None
    return decoded.text.encode("utf-8"), decoded.note


def attachment_lines(message: EmailMessage) -> list[str]:
    lines = []
    for number, part in enumerate(message.iter_attachments(), start=1):
        name = part.get_filename() or f"attachment {number}"
        payload = part.get_payload(decode=True)
        if payload is None and part.is_multipart():  # e.g. an attached message/rfc822
            size = len(part.as_bytes())
        else:
            size = len(payload or b"")
        lines.append(f"{' '.join(name.split())} ({part.get_content_type()}, {size} bytes)")
    return lines


def _senders(message: EmailMessage) -> list[str]:
    """The From header's display names and addresses, each its own entry (a filter matches either)."""
    try:
        pairs = getaddresses([str(v) for v in message.get_all("From", [])])
    except (ValueError, TypeError, IndexError):  # a malformed header names nobody
        return []
    return authors.names(*(part for pair in pairs for part in pair))


def extract_eml(source: Source) -> Extraction:
    data, file_note = message_bytes(source.stream.read())
    message = BytesParser(policy=policy.default).parsebytes(data)
    present = {key.lower() for key in message.keys()}
    if not present & {"from", "subject", "date", "message-id"}:
        return Extraction.failed("not an e-mail message (no From/Subject/Date/Message-ID header)")
    header_lines = [f"{name}: {value}" for name in HEADERS if (value := _header(message, name))]
    blocks = [Block("\n".join(header_lines))] if header_lines else []
    body, decoded = body_blocks(message)
    blocks.extend(body)
    attachments = attachment_lines(message)
    if attachments:
        blocks.append(Block("Attachments: " + "; ".join(attachments)))
    lossy = sorted({type(d).__name__ for part in message.walk() for d in part.defects} & _LOSSY)
    body_lost = decoded is not None and (decoded.lossy or decoded.text is None)
    reasons = [file_note, _body_note(decoded), f"MIME defects: {', '.join(lossy)}" if lossy else None]
    return Extraction(
        blocks=blocks,
        status="partial" if lossy or body_lost else "ok",
        reason="; ".join(r for r in reasons if r) or None,
        title=_header(message, "Subject") or None,
        authors=_senders(message),
    )
