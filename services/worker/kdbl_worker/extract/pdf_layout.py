"""A PDF page's text rebuilt from pdfium's character boxes, so that a table row is one line.

pdfium's text comes in the order the producer wrote it, with a line break wherever that order jumps to
another line. A table written cell by cell or column by column (all the labels, then each column of
numbers) comes out one cell per line, a row's label far from its numbers, and a header written line by
line comes out one word per line. Here each word's box (`FPDFText_GetLooseCharBox` on its first and
last character; a cell gap is always a space in pdfium's text) rebuilds the lines:

1. pdfium's lines are pieces, split into cells at a gap of CELL_GAP line heights or more (measured on
   the R manuals' ~250k in-line gaps: 98 % are under 0.65 line heights, a justified line's up to ~1;
   what lies at 1.5 and beyond is a table's column, a definition list, a page number), not in prose
   at a gap under 3 times the line's lower-quartile gap (a sentence's end in a loose line);
2. pieces whose vertical centres lie within ROW_TOLERANCE line heights form a row, joined left to right
   (a footnote mark or a word printed on its own joins its word's line) with CELL_SEPARATOR between
   cells, unless both sides are text (see `_joinable`: two columns of prose, an index, the wrapped
   text of two cells stay streams of lines in pdfium's order, as before); a line of justified prose
   spread so wide that all its gaps look like cells is one cell again (`_stretched`);
3. a table header printed over several lines (a column's title word-wrapped in its cell) is put
   together column by column into one line above the rows (`_stack_headers`);
4. each line is put where its first piece was in pdfium's order, so text keeps its reading order and
   never moves to another page.

A `$` printed in its own column before a number, and a `%` or `)` after one, are kept with it.

Cells are joined by tables.CELL_SEPARATOR, " | ", as in every format's tables (extract/tables.py says
why not a tab).

Cost: two box calls and a few list operations per word, ~4 ms a page on one core: extracting the
long-document eval's 28 PDFs (5,321 pages: 20 10-Ks, the R manuals) went from 28 s to 49 s. Keeping
only the two ends of prose lines without figures halved that, but lost the text header rows of
statements ("Shares | Amount | Treasury Stock | ..."): not taken.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field

import pypdfium2.raw as pdfium_c

from kdbl_worker.extract.tables import CELL_SEPARATOR

CELL_GAP = 1.5  # a gap of this many line heights inside one of pdfium's lines separates two cells
NUMBER_GAP = 0.6  # ...and this many between two numbers outside prose (a paper's narrow columns of figures)
SPACE_GAP = 0.5  # pieces nearer than this many line heights are one text line (a footnote mark)
ROW_TOLERANCE = 0.45  # pieces with vertical centres this many (larger) line heights apart share a row
TALL = 2.5  # a piece taller than this many of its words' heights (turned text) is a row of its own
PROSE_WORDS = 6  # a piece with this many words of letters is a line of prose
WIDE = 0.3  # ...and so is one wider than this share of the page's text width
HEADER_WORDS = 5  # a header cell has at most this many words...
HEADER_ROWS = 6  # ...and a header at most this many lines
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")  # and lone surrogates
_LETTERS = re.compile(r"[^\W\d_]{2,}")
_TOKEN = re.compile(r"[^\s]+|[\r\n]+")  # a word, or pdfium's line break
_AMOUNT = re.compile(r"\d[\d,]*\.\d|\d,\d{3}|[$€£¥]\s*\d|(?<![^\W\d_])\(\d|\d\s*%")  # not a year or a date
_VALUE = re.compile(r"\d|^[—–-]$")
_CURRENCY = frozenset("$€£¥")
_BULLETS = frozenset("•◦▪▫‣⁃∙·○●■□►▶✓✔➢➤-–—*")
_UNITS = frozenset({"$", "€", "£", "¥", "%"})
_MARK = re.compile(r"\((?:\d|[a-z])\)|[*†‡]")  # a footnote mark: (1), (a), *
_YEAR = re.compile(r"(?:19|20)\d\d")
_CLOSERS = frozenset({"%", ")", ")%", "%)"})

_Word = tuple[str, float, float, float, float]  # text, x0, x1, y0, y1 (PDF space: y points up)


@dataclass(slots=True, eq=False)
class _Piece:
    """One of pdfium's lines: its words with their boxes and what the page layout makes of it."""

    order: int
    words: list[_Word]
    x0: float
    x1: float
    y0: float
    y1: float
    height: float  # the median word height: the unit of every distance
    letters: int  # words of letters
    column: bool = False  # a line of a text column: prose, the end of a paragraph, a wide line
    flow: bool = False  # its text goes on in the piece right below it (or comes from the one above)
    cells: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def centre(self) -> float:
        return (self.y0 + self.y1) / 2


def _chars(textpage, count: int) -> str:
    """The page's characters, one per pdfium index: get_text_range is one call, but it differs in length
    from the index when a character lies outside the Basic Multilingual Plane (then one call per char)."""
    text = textpage.get_text_range()
    if len(text) == count:
        return text
    unicode = pdfium_c.FPDFText_GetUnicode
    return "".join(chr(code) if 0 < (code := unicode(textpage.raw, i)) < 0x110000 else "\ufffe"
                   for i in range(count))


def _pieces(textpage, bounds: tuple[float, float, float, float]) -> list[_Piece]:
    raw = textpage.raw
    count = pdfium_c.FPDFText_CountChars(raw)
    if count <= 0:
        return []
    text = _chars(textpage, count)
    left, bottom, right, top = bounds
    rect = pdfium_c.FS_RECTF()
    ref = ctypes.byref(rect)
    box = pdfium_c.FPDFText_GetLooseCharBox
    pieces: list[_Piece] = []
    words: list[_Word] = []
    for token in _TOKEN.finditer(text):
        first, after = token.span()
        if text[first] in "\r\n":
            if words and (piece := _piece(len(pieces), words)):
                pieces.append(piece)
            words = []
            continue
        box(raw, first, ref)
        x0, x1, y0, y1 = rect.left, rect.right, rect.bottom, rect.top
        if after - first > 1:
            box(raw, after - 1, ref)
            left2, right2, bottom2, top2 = rect.left, rect.right, rect.bottom, rect.top
            if x1 <= x0 and y1 <= y0:  # a character without a box (a generated one)
                x0, x1, y0, y1 = left2, right2, bottom2, top2
            elif right2 > left2 or top2 > bottom2:
                x0, x1 = min(x0, left2), max(x1, right2)
                y0, y1 = min(y0, bottom2), max(y1, top2)
        if not (left <= (x0 + x1) / 2 <= right and bottom <= (y0 + y1) / 2 <= top):
            continue  # off the page's box, which pdfium's bounded text leaves out too
        words.append((token.group(), x0, x1, y0, y1))
    if words and (piece := _piece(len(pieces), words)):
        pieces.append(piece)
    return pieces


def _piece(order: int, words: list[_Word]) -> _Piece | None:
    if any(_CONTROL.search(w[0]) for w in words):  # pdfium's marks for hyphens and unknown glyphs
        words = [(text,) + w[1:] for w in words if (text := _CONTROL.sub("", w[0]))]
        if not words:
            return None
    heights = sorted(w[4] - w[3] for w in words if w[4] > w[3])
    return _Piece(order=order, words=words,
                  x0=min(w[1] for w in words), x1=max(w[2] for w in words),
                  y0=min(w[3] for w in words), y1=max(w[4] for w in words),
                  height=max(heights[len(heights) // 2] if heights else 1.0, 0.5),
                  letters=len(_LETTERS.findall(" ".join(w[0] for w in words))))


def _rows(pieces: list[_Piece]) -> list[list[_Piece]]:
    """Pieces grouped by vertical centre, the top of the page first, each row left to right."""
    rows: list[list[_Piece]] = []
    current: list[_Piece] | None = None
    for piece in sorted(pieces, key=lambda p: -p.centre):
        if piece.y1 - piece.y0 > TALL * piece.height:
            rows.append([piece])
            continue
        anchor = current[0] if current else None
        if anchor is not None and \
                abs(piece.centre - anchor.centre) <= ROW_TOLERANCE * max(piece.height, anchor.height):
            current.append(piece)
            continue
        current = [piece]
        rows.append(current)
    for row in rows:
        row.sort(key=lambda p: p.x0)
    return rows


def _near(upper: _Piece, lower: _Piece, lines: float = 1.6) -> bool:
    return 0 <= upper.centre - lower.centre <= lines * max(upper.height, lower.height)


def _gaps(piece: _Piece) -> list[float]:
    return [b[1] - a[2] for a, b in zip(piece.words, piece.words[1:])]


def _classify(pieces: list[_Piece], rows: list[list[_Piece]]) -> None:
    """Mark the lines of text: prose, wide lines, and lines that flow on to the next in pdfium's order
    (the next piece starts right below: a paragraph, a heading over its text, a cell's wrapped text)."""
    width = max(p.x1 for p in pieces) - min(p.x0 for p in pieces)
    for piece in pieces:
        piece.column = piece.letters >= PROSE_WORDS or bool(piece.x1 - piece.x0 > WIDE * width and piece.letters)
    for piece, following in zip(pieces, pieces[1:]):
        if _near(piece, following) and piece.x0 - piece.height <= following.x0 <= piece.x0 + 3 * piece.height:
            piece.flow = following.flow = True
    for above, below in zip(rows, rows[1:]):
        for piece in below:
            if not piece.column and any(upper.letters >= PROSE_WORDS and _near(upper, piece) and
                                        abs(upper.x0 - piece.x0) <= 2 * piece.height for upper in above):
                piece.column = True  # the short last line of a paragraph


def _split(piece: _Piece) -> None:
    """The piece's cells: its words split at gaps of CELL_GAP or more (NUMBER_GAP between two numbers
    in a line that is not prose: "due 2026, 1.200%" in a justified line can be 0.6 apart too). In a line
    of prose a gap must also be 3 times its lower-quartile gap: a sentence's end in a justified line
    stays in its cell."""
    gaps = _gaps(piece)
    unit = piece.height
    floor = CELL_GAP * unit
    if piece.letters >= PROSE_WORDS and len(gaps) >= 3:
        floor = max(floor, 3 * sorted(gaps)[len(gaps) // 4])
    cells: list[tuple[str, float, float]] = []
    start = 0
    words = piece.words
    for index in range(1, len(words) + 1):
        if index < len(words):
            gap = gaps[index - 1]
            numbers = _LETTERS.search(words[index - 1][0]) is None and _LETTERS.search(words[index][0]) is None
            if gap < floor and not (numbers and gap >= NUMBER_GAP * unit and piece.letters < PROSE_WORDS):
                continue
        run = words[start:index]
        cells.append((" ".join(w[0] for w in run), run[0][1], run[-1][2]))
        start = index
    piece.cells = cells


def _numeric(piece: _Piece) -> bool:
    """A value: figures or a dash, no words."""
    return piece.letters == 0 and any(c.isdigit() or c in "—–-" for w in piece.words for c in w[0])


def _textual(piece: _Piece) -> bool:
    return piece.column or piece.flow


def _joinable(left: _Piece, right: _Piece) -> bool:
    """Two pieces of one row, apart, are cells of a table unless both are text: a column of prose, an
    index, a heading beside a paragraph of the other column stay lines of their own."""
    if _numeric(left) or _numeric(right):
        return True
    if left.flow and right.flow:  # two texts side by side: columns, or the wrapped text of two cells
        return False
    return not (left.column or right.column)


@dataclass(slots=True, eq=False)
class _Line:
    pieces: list[_Piece]
    cells: list[tuple[str, float, float]]
    order: int = -1  # where it goes in pdfium's order: its first piece's place

    def __post_init__(self) -> None:
        if self.order < 0:
            self.order = min(p.order for p in self.pieces)

    @property
    def text(self) -> str:
        return _line([c[0] for c in self.cells])


def _touching(gap: float, left: _Piece, right: _Piece, leading: bool) -> bool:
    """Two pieces `gap` apart are one text line: less than a wide space apart, or a footnote mark (a
    smaller size) less than a cell gap after its text, or before the text of its footnote (`leading`:
    the mark starts the line)."""
    unit = max(left.height, right.height)
    if gap < -0.3 * unit:  # overlapping: overprinted, or another layer of the page
        return False
    if gap < SPACE_GAP * unit:
        return True
    if gap < CELL_GAP * unit and right.order == left.order + 1 and not (_numeric(left) or _numeric(right)):
        return True  # pdfium's next piece, a justified line's stretched space away (after a footnote mark)
    return gap < CELL_GAP * unit and (_mark(right, unit) or (leading and _mark(left, unit)))


def _mark(piece: _Piece, unit: float) -> bool:
    """A footnote mark: one short word in a smaller size."""
    return len(piece.words) == 1 and len(piece.words[0][0]) <= 4 and piece.height < 0.8 * unit


def _row_lines(row: list[_Piece]) -> list[_Line]:
    """A row's cells left to right, in runs that make one line each: cells of one piece always go
    together, pieces that touch continue a cell, `_joinable` ones add theirs, others start a new line.
    When that would part a piece's cells (pieces interleaved), each piece stays a line of its own."""
    items = sorted(((cell, piece) for piece in row for cell in piece.cells), key=lambda item: item[0][1])
    lines: list[_Line] = []
    pieces, cells = [items[0][1]], [items[0][0]]
    for (before, left), (cell, piece) in zip(items, items[1:]):
        if piece is not left:
            gap = cell[1] - before[2]
            if _touching(gap, left, piece, leading=len(cells) == 1 and len(pieces) == 1):
                glue = " " if gap > 0.15 * max(piece.height, left.height) or cell[0][:1] in _BULLETS else ""
                cells[-1] = (cells[-1][0] + glue + cell[0], cells[-1][1], cell[2])
                pieces.append(piece)
                continue
            if gap < 0 or not _joinable(left, piece):
                lines.append(_Line(pieces, cells))
                pieces, cells = [piece], [cell]
                continue
            pieces.append(piece)
        cells.append(cell)
    lines.append(_Line(pieces, cells))
    if len(lines) > 1 and sum(len(set(map(id, line.pieces))) for line in lines) > len(row):
        return [_Line([piece], list(piece.cells)) for piece in row]
    return lines


def _join(left: str, right: str) -> str:
    """The separator between two cells: a `$` stays with its number, a `%` or `)` with its own, a
    bullet with its item."""
    if left in _BULLETS:
        return " "
    if left in _CURRENCY and (right[:1].isdigit() or right[:1] in ("(", ".")):
        return " "
    if right in _CLOSERS and left[-1:].isdigit():
        return " "
    return CELL_SEPARATOR


def _line(cells: list[str]) -> str:
    """Cells joined; a currency sign printed at the end of the cell before its number moves to it."""
    cells = [cell for cell in cells if cell]
    for i in range(len(cells) - 1):
        head, _, last = cells[i].rpartition(" ")
        if head and last in _CURRENCY and (cells[i + 1][:1].isdigit() or cells[i + 1][:1] == "("):
            cells[i], cells[i + 1] = head.rstrip(), f"{last} {cells[i + 1]}"
    if not cells:
        return ""
    out = cells[0]
    for before, cell in zip(cells, cells[1:]):
        out += _join(before, cell) + cell
    return out


def _stretched(line: _Line, rows: list[list[_Piece]]) -> bool:
    """A line of a justified paragraph spread so wide that its word gaps look like cell gaps: all its
    gaps wide and alike, and it starts and ends where a line of prose just above or below it does."""
    cells = line.cells
    gaps = [b[1] - a[2] for a, b in zip(cells, cells[1:])]
    unit = max(p.height for p in line.pieces)
    if not gaps or min(gaps) < CELL_GAP * unit or max(gaps) > 2 * min(gaps):
        return False
    first = line.pieces[0]
    return any(other.letters >= PROSE_WORDS and (_near(other, first) or _near(first, other)) and
               abs(other.x1 - cells[-1][2]) <= unit and abs(other.x0 - cells[0][1]) <= 3 * unit
               for row in rows for other in row if other not in line.pieces)


def _header_cell(text: str) -> bool:
    """Short, and words, a year or a lone unit sign: not a value (footnote marks aside)."""
    text = _MARK.sub("", text).strip()
    return len(text.split()) <= HEADER_WORDS and not _AMOUNT.search(text) and \
        (_LETTERS.search(text) is not None or _YEAR.fullmatch(text) is not None or text in _UNITS)


def _header_row(row: list[_Line]) -> bool:
    """Short cells, no values; in one line or several (a header cell's wrapped words flow on in
    pdfium's order, so two of them side by side are not joined into a row: stacking does it)."""
    return all(_header_cell(c[0]) and not _AMOUNT.search(_MARK.sub("", c[0])) for line in row for c in line.cells)


def _cell_count(row: list[_Line]) -> int:
    return sum(len(line.cells) for line in row)


def _merged(row: list[_Line]) -> _Line:
    return _Line([p for line in row for p in line.pieces],
                 sorted((c for line in row for c in line.cells), key=lambda c: c[1]))


def _values_row(row: list[_Line]) -> bool:
    """A row of a label and values: two or more cells, at least half of those after the first values."""
    if len(row) != 1 or len(row[0].cells) < 2:
        return False
    values = [c for c in row[0].cells[1:] if _VALUE.search(c[0]) and not _LETTERS.search(c[0])]
    return 2 * len(values) >= len(row[0].cells) - 1 and bool(_AMOUNT.search(row[0].text))


def _close(upper: list[_Line], lower: list[_Line], lines: float = 1.6) -> bool:
    return _near(upper[0].pieces[0], lower[0].pieces[0], lines)


def _stack_headers(rows: list[list[_Line]]) -> list[list[_Line]]:
    """Rows of header cells above rows of values become one line of column titles: each cell joins the
    cells above and below it whose middle it covers (or that cover its own), top to bottom. A cell that
    spans columns (a "Year Ended" over two dates) stays a line of its own.

    The header starts at a row of two or more short cells without amounts; it takes the rows above it
    whose cells each sit over one of its cells, and the rows below it of two or more such cells, at most
    HEADER_ROWS in all; the next row of two or more cells (within six rows: a "June 30, 2023" may come
    between) must hold values (amounts). A table of short words without amounts is never a header."""
    out = list(rows)
    index = 0
    while index < len(out):
        row = out[index]
        if not (_header_row(row) and _cell_count(row) >= 2):
            index += 1
            continue
        top = bottom = index
        while bottom + 1 < len(out) and bottom - top + 1 < HEADER_ROWS and _header_row(out[bottom + 1]) and \
                _cell_count(out[bottom + 1]) >= 2 and _close(out[bottom], out[bottom + 1]):
            bottom += 1
        while top > 0 and bottom - top + 1 < HEADER_ROWS and _header_row(out[top - 1]) and \
                _close(out[top - 1], out[top]) and \
                all(any(_covers(c, d) for d in _merged(out[top]).cells) for c in _merged(out[top - 1]).cells):
            top -= 1
        following = next((r for r in out[bottom + 1:bottom + 7] if _cell_count(r) > 1), None)
        if top == bottom or following is None or not _values_row(following):
            index = bottom + 1
            continue
        stacked = _stack([_merged(r) for r in out[top:bottom + 1]])
        out[top:bottom + 1] = stacked
        index = top + len(stacked)
    return out


def _covers(a: tuple[str, float, float], b: tuple[str, float, float]) -> bool:
    return a[1] <= (b[1] + b[2]) / 2 <= a[2] or b[1] <= (a[1] + a[2]) / 2 <= b[2]


def _stack(band: list[_Line]) -> list[list[_Line]]:
    """The header band's cells put together column by column (spanning cells first, on their own)."""
    cells = [(row, cell) for row, line in enumerate(band) for cell in line.cells]
    parent = list(range(len(cells)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    # a cell over two or more cells of another row (a "Year Ended" over two dates) spans columns
    spanning = [i for i, (row_i, a) in enumerate(cells)
                if any(sum(1 for row_j, b in cells if row_j == row and _covers(a, b)) >= 2
                       for row in range(len(band)) if row != row_i)]
    for i, (row_i, a) in enumerate(cells):
        for j in range(i + 1, len(cells)):
            row_j, b = cells[j]
            if row_j != row_i and i not in spanning and j not in spanning and _covers(a, b):
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(len(cells)):
        if i not in spanning:
            groups.setdefault(find(i), []).append(i)
    columns: list[list[int]] = []
    for members in groups.values():
        rows_of = [cells[i][0] for i in members]
        if len(set(rows_of)) != len(rows_of):  # two cells of one row in one column: not a header
            return [[line] for line in band]  # (rows of several lines come back as one)
        columns.append(sorted(members, key=lambda i: cells[i][0]))
    pieces = [p for line in band for p in line.pieces]
    order = min(p.order for p in pieces)  # all at the band's place: spanning cells, then the titles
    lines: list[list[_Line]] = []
    for row in sorted({cells[i][0] for i in spanning}):
        own = [cells[i][1] for i in spanning if cells[i][0] == row]
        lines.append([_Line(band[row].pieces, sorted(own, key=lambda c: c[1]), order)])
    title = []
    for column in sorted(columns, key=lambda c: min(cells[i][1][1] for i in c)):
        parts = [cells[i][1] for i in column]
        title.append((" ".join(p[0] for p in parts), min(p[1] for p in parts), max(p[2] for p in parts)))
    if title:
        lines.append([_Line(pieces, title, order)])
    return lines


def page_text(textpage, bounds: tuple[float, float, float, float]) -> str:
    """The page's text, one visual line per line, table cells joined by CELL_SEPARATOR."""
    pieces = _pieces(textpage, bounds)
    if not pieces:
        return ""
    rows = _rows(pieces)
    _classify(pieces, rows)
    for piece in pieces:
        _split(piece)
    lines = [_row_lines(row) for row in rows]
    for index, row in enumerate(lines):
        for line in row:
            if len(line.cells) > 1 and _stretched(line, rows[max(0, index - 1):index + 2]):
                line.cells = [(" ".join(c[0] for c in line.cells), line.cells[0][1], line.cells[-1][2])]
    lines = _stack_headers(lines)
    ordered = sorted((line for row in lines for line in row), key=lambda line: line.order)
    return "\n".join(text for line in ordered if (text := line.text))
