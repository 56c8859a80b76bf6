"""HTML: the main content (main/article when present), without scripts, navigation or boilerplate.

Bytes are decoded by extract/encoding.py with the charset a `<meta>` in the first 4 KiB declares
(`<meta charset=...>` or `http-equiv` Content-Type): used when the page is not valid UTF-8, else detected.

Each block carries its heading path (extract/headings.py) from the h1-h6 whose text is kept (a heading
inside a skipped header/nav does not count); the heading's own block carries the path with it.

A data table is one block, a row per line, its cells joined by " | " (extract/tables.py); a table that
lays out a page (a cell with a heading, a nested table, three or more paragraphs or 500+ characters:
old sites, HTML mail) keeps its cells as blocks, as before.

Sloppy HTML keeps its text, read the way a browser would: a `<head>` left open ends at the first tag
or text that cannot stand in it, a `<title>` left open at the next tag, an unclosed comment runs to
the end; a page whose text all sits in boilerplate (an unclosed `<header>` or `<nav>`) keeps it
rather than coming out empty.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

from kdbl_worker.extract import authors
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode
from kdbl_worker.extract.headings import HeadingPath
from kdbl_worker.extract.tables import CELL_SEPARATOR

# never text; and boilerplate, kept only when a page has no other text (an unclosed <header> or <nav>)
_NEVER = {"script", "style", "noscript", "template", "svg"}
_SKIP = _NEVER | {"nav", "header", "footer", "aside", "form", "button"}
_BLOCK = {
    "p", "div", "section", "article", "main", "li", "ul", "ol", "table", "tr", "h1", "h2", "h3", "h4",
    "h5", "h6", "pre", "blockquote", "br", "hr", "dd", "dt", "figcaption", "td", "th", "body", "caption",
}
_TABLE = re.compile(r"<table", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "wbr"}
_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
# what may stand in <head>; any other tag, or text, ends it (HTML's "in head" rule), </head> or not
_HEAD = {"head", "title", "meta", "link", "style", "script", "base", "noscript", "template", "basefont", "bgsound"}
_ROW_END = "\x1e"  # a table row's end inside its table's block: a line break that whitespace folding keeps
_CONTAINERS = {"p", "div", "ul", "ol", "li", "blockquote", "pre", "section", "article", "dl", "form"}
LAYOUT_CELL_CHARS = 500  # a cell with more text than this holds a page's content, not a value


class _TableKinds(HTMLParser):
    """A first pass that tells data tables from layout tables, in the order they open: a table whose
    cell holds another table, a heading, three or more paragraphs or blocks, or LAYOUT_CELL_CHARS of
    text lays out a page (old sites, HTML mail) and keeps its cells as blocks; the others are data."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.data: list[bool] = []  # per table, in opening order
        self.open: list[list[int]] = []  # per open table: [its index, blocks in the cell, chars in it]

    def _layout(self) -> None:
        self.data[self.open[-1][0]] = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            if self.open:
                self._layout()
            self.open.append([len(self.data), 0, 0])
            self.data.append(True)
        elif not self.open:
            return
        elif tag in ("td", "th", "tr"):
            self.open[-1][1:] = [0, 0]
        elif tag in _HEADINGS:
            self._layout()
        elif tag in _CONTAINERS:
            self.open[-1][1] += 1
            if self.open[-1][1] >= 3:
                self._layout()

    def handle_endtag(self, tag: str) -> None:
        if tag == "table" and self.open:
            self.open.pop()

    def handle_data(self, data: str) -> None:
        if self.open:
            self.open[-1][2] += len(data.strip())
            if self.open[-1][2] > LAYOUT_CELL_CHARS:
                self._layout()


def _span(attrs: list[tuple[str, str | None]], name: str) -> int:
    value = next((v for k, v in attrs if k == name), None) or "1"
    return min(max(int(value), 1), 1000) if value.strip().isdigit() else 1


class _Table:
    """A data table's current row: cells written, the grid column reached, and cells of rows above that
    span down into it (rowspan): each row they span repeats their text in its place, so every row
    carries its label ("2025 | Q1 | January | $134")."""

    def __init__(self) -> None:
        self.cells = 0
        self.column = 0
        self.row_open = False
        self.down: dict[int, list] = {}  # grid column -> [text, rows still spanned, colspan]
        self.capture: list[str] | None = None  # the text of the current cell, when it spans down
        self.capture_at = (0, 0, 1)

    def start_row(self, write) -> None:
        self.end_row(write)
        self.cells, self.column, self.row_open = 0, 0, True

    def start_cell(self, rowspan: int, colspan: int, write) -> None:
        self._end_cell()
        self._fill(write, rest=False)
        if self.cells:
            write(CELL_SEPARATOR)
        self.cells += 1
        if rowspan > 1:
            self.capture, self.capture_at = [], (self.column, rowspan - 1, colspan)
        self.column += colspan

    def end_row(self, write) -> None:
        if self.row_open:
            self._end_cell()
            self._fill(write, rest=True)
            self.row_open = False

    def _end_cell(self) -> None:
        if self.capture is not None:
            column, rows, span = self.capture_at
            self.down[column] = [" ".join("".join(self.capture).split()), rows, span]
            self.capture = None

    def _fill(self, write, rest: bool) -> None:
        """Write the spanned-down cells standing at the current column (`rest`: all those after it)."""
        while self.down:
            if self.column not in self.down:
                later = [c for c in self.down if c > self.column]
                if not rest or not later:
                    return
                self.column = min(later)
            text, rows, span = self.down[self.column]
            if self.cells:
                write(CELL_SEPARATOR)
            write(text)
            self.cells += 1
            if rows <= 1:
                del self.down[self.column]
            else:
                self.down[self.column][1] = rows - 1
            self.column += span


class _Stream:
    """Blocks being written, each a list of parts joined at the end (one growing string would be copied
    at every write: quadratic on a 20,000-row table), whether it holds text yet, and its heading path."""

    def __init__(self) -> None:
        self.parts: list[list[str]] = [[]]
        self.filled = [False]
        self.paths: list[tuple[str, ...]] = [()]

    def write(self, text: str) -> None:
        self.parts[-1].append(text)
        if not self.filled[-1] and text.strip():
            self.filled[-1] = True

    def new_block(self, path: tuple[str, ...]) -> None:
        if self.filled[-1]:
            self.parts.append([])
            self.filled.append(False)
            self.paths.append(path)
        else:  # nothing written yet: the block starts here, under the current headings
            self.paths[-1] = path

    def own_path(self, path: tuple[str, ...]) -> None:
        """A heading just read: its own block carries the path with it."""
        if self.filled[-1]:
            self.paths[-1] = path


class _Collector(HTMLParser):
    def __init__(self, data_tables: list[bool]) -> None:
        super().__init__(convert_charrefs=True)
        self.data_tables = data_tables  # _TableKinds.data
        self.tables_seen = 0
        self.skip_depth = 0
        self.never_depth = 0  # inside script/style/...: not even the fallback stream
        self.stack: list[str] = []
        self.title: list[str] = []
        self.in_title = False
        self.authors: list[str] = []  # <meta name="author" content="...">
        # Three streams: everything but boilerplate, only what sits inside <main>/<article>, and
        # everything with the boilerplate (the fallback of a page whose text all sits in, say, an
        # unclosed <header>).
        self.all = _Stream()
        self.main = _Stream()
        self.any = _Stream()
        self.main_depth = 0
        self.headings = HeadingPath()  # and the heading being read
        self.open_heading: tuple[int, list[str]] | None = None
        self.rows: list[_Table | None] = []  # per open table (None: a layout table)


    def _in_data_table(self) -> bool:
        return bool(self.rows) and self.rows[-1] is not None

    def _break(self) -> None:
        if self._in_data_table():  # a cell's paragraphs stay on its row's line
            self._write(" ")
            return
        for stream in (self.all, self.main, self.any):
            stream.new_block(self.headings.path)

    def _write(self, text: str) -> None:
        if self.never_depth or "head" in self.stack:
            return
        self.any.write(text)
        if self.skip_depth:
            return
        self.all.write(text)
        if self.main_depth:
            self.main.write(text)

    def _pop(self, index: int) -> None:
        """Close the open elements from stack[index] up (unclosed children with their parent)."""
        for popped in self.stack[index:]:
            name = popped.removesuffix("!skip")
            if popped.endswith("!skip"):
                self.skip_depth -= 1
                self.never_depth -= name in _NEVER
            if name in ("main", "article"):
                self.main_depth -= 1
            if name == "table" and self.rows:
                table = self.rows.pop()
                if table is not None:
                    table.end_row(self._write)
        del self.stack[index:]

    def _end_head(self) -> None:
        if "head" in self.stack:
            self._pop(len(self.stack) - 1 - self.stack[::-1].index("head"))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.in_title:  # a <title> left open ends at the next tag, not at the end of the page
            self.in_title = False
        if tag not in _HEAD:
            self._end_head()
        if tag == "title":
            self.in_title = True
        if tag == "meta" and any(k == "name" and (v or "").strip().lower() == "author" for k, v in attrs):
            self.authors.extend(v for k, v in attrs if k == "content" and v)
        if tag in _VOID:
            if tag in _BLOCK:
                self._break()
            return
        if tag == "table":
            data = self.tables_seen < len(self.data_tables) and self.data_tables[self.tables_seen]
            self.tables_seen += 1
            self._break()  # a data table is a block of its own, its rows its lines
            self.stack.append(tag)
            self.rows.append(_Table() if data else None)
            return
        table = self.rows[-1] if self.rows else None
        if table is not None and tag == "tr":
            table.start_row(self._write)
            nested = sum(1 for r in self.rows if r is not None) > 1
            self._write(" " if nested else _ROW_END)
        elif table is not None and tag in ("td", "th"):
            if not table.row_open:  # a cell without its <tr>
                table.start_row(self._write)
            table.start_cell(_span(attrs, "rowspan"), _span(attrs, "colspan"), self._write)
        self.stack.append(tag)
        if tag in _SKIP or any(v == "navigation" for k, v in attrs if k == "role"):
            self.skip_depth += 1
            self.never_depth += tag in _NEVER
            self.stack[-1] = tag + "!skip"
        if tag in ("main", "article"):
            self.main_depth += 1
        if tag in _BLOCK and not (tag in ("tr", "td", "th") and self._in_data_table()):
            self._break()
        if tag in _HEADINGS and not self.skip_depth:
            self.open_heading = (_HEADINGS[tag], [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self.in_title = False
        if tag in _VOID:
            return
        if tag in _HEADINGS and self.open_heading is not None:
            level, parts = self.open_heading
            self.open_heading = None
            path = self.headings.enter(level, "".join(parts))
            for stream in (self.all, self.main, self.any):
                stream.own_path(path)
        if tag == "tr" and self._in_data_table():
            self.rows[-1].end_row(self._write)
        # pop to the matching tag (tolerates unclosed children)
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].removesuffix("!skip") == tag:
                self._pop(i)
                break
        if tag in _BLOCK and not (tag in ("tr", "td", "th") and self._in_data_table()):
            self._break()

    def handle_data(self, data: str) -> None:
        if self.in_title:
            self.title.append(data)
            return
        if "head" in self.stack and data.strip() and not self.never_depth:
            self._end_head()  # text cannot stand in <head>: the body has begun
        data = data.replace(_ROW_END, " ")
        self._write(data)
        table = self.rows[-1] if self.rows else None
        if table is not None and table.capture is not None and not (self.never_depth or self.skip_depth):
            table.capture.append(data)
        if self.skip_depth or self.never_depth or "head" in self.stack:
            return
        if self.open_heading is not None:
            self.open_heading[1].append(data)


def _clean(stream: _Stream) -> list[Block]:
    out = []
    for parts, path in zip(stream.parts, stream.paths, strict=True):
        raw = "".join(parts)
        rows = (" ".join(row.split()) for row in raw.split(_ROW_END))
        text = "\n".join(row for row in rows if row and row.replace("|", "").strip())
        if text:
            out.append(Block(text, heading=path))
    return out


def extract_html(source: Source) -> Extraction:
    data = source.stream.read()
    meta = _META_CHARSET.search(data, 0, 4096)
    decoded = decode(data, meta.group(1).decode("ascii") if meta else None)
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    text = decoded.text
    comment = text.rfind("<!--")
    if comment >= 0 and text.find("-->", comment) < 0:  # an unclosed comment runs to the end
        text = text[:comment]
    kinds = _TableKinds()
    if _TABLE.search(text):  # the first pass costs a second parse: only for pages with tables
        kinds.feed(text)
        kinds.close()
    parser = _Collector(kinds.data)
    parser.feed(text)
    parser.close()
    blocks = _clean(parser.main) or _clean(parser.all) or _clean(parser.any)
    title = " ".join("".join(parser.title).split()) or None
    return Extraction(blocks=blocks, status="partial" if decoded.lossy else "ok", reason=decoded.note,
                      title=title, authors=authors.names(*parser.authors))
