"""Markdown: paragraphs and headings in reading order; YAML front matter dropped."""

from __future__ import annotations

import re

from kdbl_worker.extract.base import Extraction, Source
from kdbl_worker.extract.text import decode_text, paragraphs

_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def extract_markdown(source: Source) -> Extraction:
    text, problem = decode_text(source.stream.read())
    if text is None:
        return Extraction.failed(problem or "not text")
    text = _FRONT_MATTER.sub("", text.replace("\r\n", "\n"), count=1)
    heading = _HEADING.search(text)
    return Extraction(
        blocks=paragraphs(text),
        status="partial" if problem else "ok",
        reason=problem,
        title=heading.group(1) if heading else None,
    )
