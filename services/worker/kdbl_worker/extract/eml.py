"""E-mail (.eml, RFC 822/MIME) via the stdlib email package.

Blocks: the headers (From/To/Cc/Date/Subject), the body (text/plain preferred, else
HTML through the HTML extractor), and one "Attachments:" block listing name, type and
size. Attachments are listed, not extracted.
"""

from __future__ import annotations

import io
from email import policy
from email.message import EmailMessage
from email.parser import BytesParser

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.html import extract_html
from kdbl_worker.extract.text import paragraphs

HEADERS = ("From", "To", "Cc", "Date", "Subject")
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


def _part_text(part: EmailMessage) -> str:
    try:
        content = part.get_content()
    except (LookupError, ValueError, AssertionError):  # unknown charset, bad transfer encoding
        payload = part.get_payload(decode=True) or b""
        content = payload.decode("utf-8", errors="replace")
    if isinstance(content, bytes):
        content = content.decode("utf-8", errors="replace")
    return content if isinstance(content, str) else ""


def body_blocks(message: EmailMessage) -> list[Block]:
    """The message body as Blocks: text/plain if present, else text/html converted to text."""
    part = message.get_body(preferencelist=("plain", "html"))
    if part is None:
        return []
    text = _part_text(part)
    if part.get_content_subtype() == "html":
        data = text.encode("utf-8")
        return extract_html(Source(io.BytesIO(data), "body.html", len(data), "text/html")).blocks
    return paragraphs(text.replace("\r\n", "\n"))


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


def extract_eml(source: Source) -> Extraction:
    message = BytesParser(policy=policy.default).parse(source.stream)
    present = {key.lower() for key in message.keys()}
    if not present & {"from", "subject", "date", "message-id"}:
        return Extraction.failed("not an e-mail message (no From/Subject/Date/Message-ID header)")
    header_lines = [f"{name}: {value}" for name in HEADERS if (value := _header(message, name))]
    blocks = [Block("\n".join(header_lines))] if header_lines else []
    blocks.extend(body_blocks(message))
    attachments = attachment_lines(message)
    if attachments:
        blocks.append(Block("Attachments: " + "; ".join(attachments)))
    lossy = sorted({type(d).__name__ for part in message.walk() for d in part.defects} & _LOSSY)
    return Extraction(
        blocks=blocks,
        status="partial" if lossy else "ok",
        reason=f"MIME defects: {', '.join(lossy)}" if lossy else None,
        title=_header(message, "Subject") or None,
    )
