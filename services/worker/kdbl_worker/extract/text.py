"""Plain text and reStructuredText: decode, detect binary junk, split into paragraphs."""

from __future__ import annotations

import codecs
import re

from kdbl_worker.extract.base import Block, Extraction, Source

_PARA = re.compile(r"\n\s*\n")
_SNIFF = 8192


def decode_text(data: bytes) -> tuple[str | None, str | None]:
    """Return (text, problem). text is None when the bytes are not text at all."""
    head = data[:_SNIFF]
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            return data.decode("utf-16"), None
        except UnicodeDecodeError:
            return None, "invalid UTF-16 text"
    if b"\x00" in head:
        return None, "binary content (NUL bytes) in a text file"
    control = sum(1 for b in head if b < 9 or 13 < b < 32)
    if head and control / len(head) > 0.05:
        return None, "binary content (control characters) in a text file"
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        return text, f"not valid UTF-8 (first bad byte at offset {exc.start}); undecodable bytes replaced"


def paragraphs(text: str) -> list[Block]:
    return [Block(p.strip("\n")) for p in _PARA.split(text) if p.strip()]


def extract_text(source: Source) -> Extraction:
    text, problem = decode_text(source.stream.read())
    if text is None:
        return Extraction.failed(problem or "not text")
    return Extraction(
        blocks=paragraphs(text),
        status="partial" if problem else "ok",
        reason=problem,
    )
