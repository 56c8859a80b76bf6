"""Markdown: paragraphs and headings in reading order; YAML front matter dropped."""

from __future__ import annotations

import re

from kdbl_worker.extract.base import Extraction, Source
from kdbl_worker.extract.encoding import decode
from kdbl_worker.extract.text import paragraphs

_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def extract_markdown(source: Source) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    text = _FRONT_MATTER.sub("", decoded.text.replace("\r\n", "\n"), count=1)
    heading = _HEADING.search(text)
    return Extraction(
        blocks=paragraphs(text),
        status="partial" if decoded.lossy else "ok",
        reason=decoded.note,
        title=heading.group(1) if heading else None,
    )
