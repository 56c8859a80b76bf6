"""Markdown: paragraphs and headings in reading order; YAML front matter dropped from the text, its
`tags` kept as the file's own labels (files.labels, with its source's; kdbl_core.sources.labels).

`tags` is read in the three forms front matter tools write (Jekyll, Hugo, Obsidian): a flow list
`tags: [a, "b c"]`, a comma-separated scalar `tags: a, b`, or a block list (`tags:` then `- a` lines).
No YAML library: those forms are all a tag list takes, and a dependency for one key is not worth it.

Each paragraph Block carries its heading path (extract/headings.py): ATX headings (`## Install`, up to
three spaces of indent, closing `#`s dropped) and setext headings (a text line underlined with `===` for
level 1 or `---` for level 2), never a `#` line inside a fenced code block (``` or ~~~, closed by a fence
of the same character at least as long). A block whose first line is a heading carries the path with it.
"""

from __future__ import annotations

import re

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode
from kdbl_worker.extract.headings import HeadingPath
from kdbl_worker.extract.text import paragraphs

_FRONT_MATTER = re.compile(r"\A---\n(.*?\n)---\n", re.DOTALL)
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_TAGS = re.compile(r"^tags[ \t]*:[ \t]*(.*)$", re.MULTILINE)
_ITEM = re.compile(r"[ \t]*-[ \t]+(.*)")
_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))??(?:[ \t]+#+)?[ \t]*")
_SETEXT = re.compile(r" {0,3}(=+|-+)[ \t]*")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")


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


def _heading_at(lines: list[str], i: int) -> tuple[int, str] | None:
    """(level, text) when line i opens a heading: an ATX line, or a text line the next line underlines."""
    atx = _ATX.fullmatch(lines[i])
    if atx is not None:
        return len(atx.group(1)), atx.group(2) or ""
    if i + 1 < len(lines) and lines[i].strip() and _FENCE.match(lines[i]) is None:
        underline = _SETEXT.fullmatch(lines[i + 1])
        if underline is not None:
            return (1 if underline.group(1)[0] == "=" else 2), lines[i].strip()
    return None


def with_headings(blocks: list[Block]) -> list[Block]:
    """Stamp each paragraph block with the heading path at its start (the blocks' text is unchanged)."""
    headings = HeadingPath()
    fence = ""  # the open code fence's marker, "" outside code
    for block in blocks:
        lines = block.text.split("\n")
        block.heading = headings.path
        i = 0
        while i < len(lines):
            opening = _FENCE.match(lines[i])
            if fence:
                if opening is not None and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= \
                        len(fence) and not lines[i][opening.end():].strip():
                    fence = ""
            elif opening is not None:
                fence = opening.group(1)
            elif (found := _heading_at(lines, i)) is not None:
                path = headings.enter(*found)
                if i == 0:
                    block.heading = path
                i += 1 if _ATX.fullmatch(lines[i]) is None else 0  # skip a setext underline
            i += 1
    return blocks


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
        blocks=with_headings(paragraphs(text)),
        status="partial" if decoded.lossy else "ok",
        reason=decoded.note,
        title=heading.group(1) if heading else None,
        tags=front_matter_tags(front.group(1)) if front else [],
    )
