"""Markdown: paragraphs and headings in reading order; YAML front matter dropped from the text, its
`tags` kept as the file's own labels (files.labels, with its source's; kdbl_core.sources.labels).

`tags` is read in the three forms front matter tools write (Jekyll, Hugo, Obsidian): a flow list
`tags: [a, "b c"]`, a comma-separated scalar `tags: a, b`, or a block list (`tags:` then `- a` lines).
No YAML library: those forms are all a tag list takes, and a dependency for one key is not worth it.
"""

from __future__ import annotations

import re

from kdbl_worker.extract.base import Extraction, Source
from kdbl_worker.extract.encoding import decode
from kdbl_worker.extract.text import paragraphs

_FRONT_MATTER = re.compile(r"\A---\n(.*?\n)---\n", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TAGS = re.compile(r"^tags[ \t]*:[ \t]*(.*)$", re.MULTILINE)
_ITEM = re.compile(r"[ \t]*-[ \t]+(.*)")


def _unquote(value: str) -> str:
    value = value.split(" #", 1)[0].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1]
    return value.strip()


def front_matter_tags(front: str) -> list[str]:
    match = _TAGS.search(front)
    if match is None:
        return []
    inline = match.group(1).strip()
    if inline:
        inline = inline.removeprefix("[").removesuffix("]") if inline.startswith("[") else inline
        values = inline.split(",")
    else:  # a block list on the following lines
        values = []
        for line in front[match.end():].lstrip("\n").split("\n"):
            item = _ITEM.fullmatch(line)
            if item is None:
                break
            values.append(item.group(1))
    return list(dict.fromkeys(t for t in (_unquote(v) for v in values) if t))


def extract_markdown(source: Source) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    text = decoded.text.replace("\r\n", "\n")
    front = _FRONT_MATTER.match(text)
    if front is not None:
        text = text[front.end():]
    heading = _HEADING.search(text)
    return Extraction(
        blocks=paragraphs(text),
        status="partial" if decoded.lossy else "ok",
        reason=decoded.note,
        title=heading.group(1) if heading else None,
        tags=front_matter_tags(front.group(1)) if front else [],
    )
