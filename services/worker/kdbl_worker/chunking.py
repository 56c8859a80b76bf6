"""Pack extracted blocks into chunks with exact char/page/time locators.

The file's extracted text is the blocks joined by blank lines; every chunk is a slice
`text[char_start:char_end]` of it, so locators index into what `get_file_text` returns.
A chunk never spans two pages; long blocks are cut at sentence or word boundaries.
Each chunk's `context_header` is the heading path of its first block (Block.heading, set by the
extractors that have headings), parts joined by " > ", at most HEADER_CHARS characters. A chunk that
opens with headings ("# Manual", "## Heliostats": short blocks that each start a section) takes the path
of the text they introduce ("Manual > Heliostats"), not the first heading's alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdbl_core.content.records import Chunk
from kdbl_worker.extract.base import Block

SEPARATOR = "\n\n"
# Defaults (KDBL_CHUNK_TARGET_CHARS / KDBL_CHUNK_MAX_CHARS): a chunk plus its title fits the ~1,800-char hit
# text; measured on SciFact in docs/benchmarks.md.
DEFAULT_TARGET = 1200
DEFAULT_MAX = 1800
_SENTENCE_END = re.compile(r"[.!?。]\s|\n")
HEADER_CHARS = 512
HEADER_SEP = " > "
_PART_CHARS = 160


def context_header(path: tuple[str, ...]) -> str | None:
    """A heading path as one line: each part's whitespace folded and cut at _PART_CHARS, the whole at most
    HEADER_CHARS (the middle parts give way first, to "…": the outermost and the nearest headings stay)."""
    parts = [p if len(p) <= _PART_CHARS else p[:_PART_CHARS - 1] + "…"
             for p in (" ".join(part.split()) for part in path) if p]
    if not parts:
        return None
    while len(HEADER_SEP.join(parts)) > HEADER_CHARS and len(parts) > 3:
        parts[1:3] = ["…"]  # one "…" for the parts below the first, outermost first, until it fits
    return HEADER_SEP.join(parts)[:HEADER_CHARS]


@dataclass(slots=True)
class _Span:
    start: int
    end: int
    page_no: int | None
    ts_start_ms: int | None
    ts_end_ms: int | None
    header: str | None = None
    opener: bool = False  # a short block that starts a section (a heading): the text after it names the chunk


def _split_long(text: str, start: int, end: int, max_chars: int, target: int,
                lines: bool = False) -> list[tuple[int, int]]:
    """Cut [start, end) into pieces of at most max_chars, preferring sentence then word breaks
    (with `lines`, code and logs: a blank line, then a line end, never mid-line when a line end is there)."""
    pieces = []
    while end - start > max_chars:
        window = text[start:start + max_chars]
        cut = -1
        if lines:
            cut = window.rfind("\n\n", target // 2) + 1 or window.rfind("\n", target // 2) + 1
        if cut <= 0:
            for match in _SENTENCE_END.finditer(window, target // 2):
                cut = match.end()
        if cut <= 0:
            cut = window.rfind(" ", target // 2)
        if cut <= 0:
            cut = max_chars
        pieces.append((start, start + cut))
        start += cut
        while start < end and text[start].isspace():
            start += 1
    if start < end:
        pieces.append((start, end))
    return pieces


def chunk_blocks(blocks: list[Block], *, target: int = DEFAULT_TARGET, max_chars: int = DEFAULT_MAX,
                 lines: bool = False) -> tuple[str, list[Chunk]]:
    """Return (full extracted text, chunks in reading order); `lines`: long blocks are cut at line ends."""
    parts: list[str] = []
    spans: list[_Span] = []
    offset = 0
    small = target // 4  # a title or heading: it joins the text it introduces when that fits max_chars
    path: tuple[str, ...] = ()
    for block in blocks:
        body = block.text.strip()
        if not body:
            continue
        if parts:
            parts.append(SEPARATOR)
            offset += len(SEPARATOR)
        parts.append(body)
        opener = bool(block.heading) and block.heading != path and len(body) < small
        path = block.heading
        spans.append(_Span(offset, offset + len(body), block.page_no, block.ts_start_ms, block.ts_end_ms,
                           context_header(block.heading), opener))
        offset += len(body)
    full = "".join(parts)

    # Cut oversized spans first, then greedily merge neighbours on the same page up to `target`.
    pieces: list[_Span] = []
    for span in spans:
        if span.end - span.start <= max_chars:
            pieces.append(span)
            continue
        for s, e in _split_long(full, span.start, span.end, max_chars, target, lines):
            pieces.append(_Span(s, e, span.page_no, span.ts_start_ms, span.ts_end_ms, span.header))

    chunks: list[Chunk] = []
    current: _Span | None = None

    def flush() -> None:
        if current is not None:
            chunks.append(Chunk(
                seq=len(chunks), text=full[current.start:current.end], char_start=current.start,
                char_end=current.end, page_no=current.page_no, ts_start_ms=current.ts_start_ms,
                ts_end_ms=current.ts_end_ms, context_header=current.header,
            ))

    for piece in pieces:
        if (current is not None and piece.page_no == current.page_no
                and (piece.end - current.start <= target
                     or (current.end - current.start < small and piece.end - current.start <= max_chars))):
            current.end = piece.end
            if piece.ts_end_ms is not None:
                current.ts_end_ms = piece.ts_end_ms
            if current.ts_start_ms is None:
                current.ts_start_ms = piece.ts_start_ms
            if current.opener:  # so far only headings: the chunk is named by what follows them
                current.header, current.opener = piece.header, piece.opener
            continue
        flush()
        current = _Span(piece.start, piece.end, piece.page_no, piece.ts_start_ms, piece.ts_end_ms, piece.header,
                        piece.opener)
    flush()
    return full, chunks
