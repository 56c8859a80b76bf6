"""The heading path above a block: the stack of enclosing headings, as the format's own outline gives it.

Extractors with headings (Markdown ATX/setext, HTML h1-h6, DOCX heading styles and outline levels,
ODT text:h, EPUB chapters' h1-h6, the PDF outline) feed each heading to one `HeadingPath` in reading
order and stamp every Block with `path`: a heading of level n closes every open heading of level >= n
(an h2 after "A > B > C" at levels 1, 2, 3 gives "A > <the h2>"), and a heading's own block carries the
path including itself. chunking.py turns the path of a chunk's first block into its `context_header`.
"""

from __future__ import annotations

MAX_DEPTH = 16  # deeper headings are not pushed (a pathological nesting stays bounded)
MAX_PART = 200  # characters of one heading kept in the path


class HeadingPath:
    """The open headings as (level, text); levels need not be contiguous (an h1 then an h3)."""

    __slots__ = ("_stack",)

    def __init__(self) -> None:
        self._stack: list[tuple[int, str]] = []

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(text for _, text in self._stack)

    def enter(self, level: int, text: str) -> tuple[str, ...]:
        """A heading of `level` (smaller is outer) begins: close those at its level or deeper, open it
        (an empty heading only closes) and return the new path."""
        while self._stack and self._stack[-1][0] >= level:
            self._stack.pop()
        title = " ".join(text.split())[:MAX_PART]
        if title and len(self._stack) < MAX_DEPTH:
            self._stack.append((level, title))
        return self.path
