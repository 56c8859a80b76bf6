"""Plain text and reStructuredText: decode (extract/encoding.py), split into paragraphs."""

from __future__ import annotations

import re

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode

_PARA = re.compile(r"\n\s*\n")


def paragraphs(text: str) -> list[Block]:
    return [Block(p.strip("\n")) for p in _PARA.split(text) if p.strip()]


def extract_text(source: Source) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    return Extraction(
        blocks=paragraphs(decoded.text),
        status="partial" if decoded.lossy else "ok",
        reason=decoded.note,
    )
