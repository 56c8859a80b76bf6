"""Word .docx via python-docx: paragraphs and tables in body order, one Block each.

python-docx opens the package (its lxml parser does not resolve entities); the body is
walked here so that text boxes, content controls (w:sdt) and equation text (m:t), which
`Paragraph.text` leaves out, are kept. Headings stay as ordinary paragraphs, and every body block carries
the heading path above it (extract/headings.py): a paragraph is a heading by its own outline level
(w:outlineLvl, 0-8) or its style's: the style's outline level, else its name ("Title" is level 0,
"heading N" level N, the built-in names whatever a localised style id says), following w:basedOn.
Paragraphs in table cells and text boxes are never headings.
"""

from __future__ import annotations

import posixpath
import re

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.oxml import parse_xml

from kdbl_worker.extract import authors
from kdbl_worker.extract.archive import LegacyBinary, PackageError, check_zip, guarded_ooxml, read_member
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.headings import HeadingPath
from kdbl_worker.extract.tables import row_text

_STRICT_MAIN = "http://purl.oclc.org/ooxml/officeDocument/relationships/officeDocument"
# VML duplicates of DrawingML shapes, deleted text, field codes, the old side of a move
_SKIP = {"Fallback", "delText", "instrText", "moveFrom"}
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_HEADING_NAME = re.compile(r"heading\s*([1-9])")
_BODY_LEVEL = 9  # w:outlineLvl 9: body text


class _Outline:
    """Heading levels of paragraph styles (style id -> level; None: not a heading) and the open headings."""

    def __init__(self, styles_element=None) -> None:
        self.path = HeadingPath()
        own: dict[str, int | None] = {}
        based: dict[str, str] = {}
        for style in styles_element if styles_element is not None else ():
            if _local(style.tag) != "style" or style.get(f"{_W}type") != "paragraph":
                continue
            sid = style.get(f"{_W}styleId") or ""
            own[sid] = None
            name = style.find(f"{_W}name")
            name = (name.get(f"{_W}val") or "").strip().lower() if name is not None else ""
            level = _outline_level(style.find(f"{_W}pPr"))
            if level is None and name == "title":
                level = 0
            elif level is None and (match := _HEADING_NAME.fullmatch(name)):
                level = int(match.group(1))
            own[sid] = level
            parent = style.find(f"{_W}basedOn")
            if parent is not None and parent.get(f"{_W}val"):
                based[sid] = parent.get(f"{_W}val")
        self.levels: dict[str, int | None] = {}
        for sid in own:
            seen, at = 0, sid
            while own.get(at) is None and at in based and seen < 10:
                at, seen = based[at], seen + 1
            self.levels[sid] = own.get(at)

    def level(self, paragraph) -> int | None:
        props = paragraph.find(f"{_W}pPr")
        level = _outline_level(props)
        if level is not None or props is None:
            return level
        style = props.find(f"{_W}pStyle")
        return self.levels.get(style.get(f"{_W}val") or "") if style is not None else None


def _outline_level(props) -> int | None:
    """A w:outlineLvl of 0-8 as heading level 1-9 (9, body text, and garbage: None)."""
    element = props.find(f"{_W}outlineLvl") if props is not None else None
    try:
        value = int(element.get(f"{_W}val")) if element is not None else _BODY_LEVEL
    except (TypeError, ValueError):
        return None
    return value + 1 if 0 <= value < _BODY_LEVEL else None


def _local(tag: object) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _run_text(element, out: list[str], boxes: list) -> None:
    """Collect a paragraph's text in order; text-box contents go to `boxes` (their own paragraphs)."""
    for child in element:
        name = _local(child.tag)
        if not name or name.endswith("Pr") or name in _SKIP:
            continue
        if name == "t":  # w:t and m:t
            out.append(child.text or "")
        elif name == "tab":
            out.append("\t")
        elif name in ("br", "cr"):
            out.append("\n")
        elif name == "txbxContent":
            boxes.append(child)
        else:
            _run_text(child, out, boxes)


def _paragraph(element) -> tuple[str, list]:
    out: list[str] = []
    boxes: list = []
    _run_text(element, out, boxes)
    return "".join(out).strip(), boxes


def _cell_text(cell) -> str:
    inner: list[Block] = []
    _walk(cell, inner)
    return " ".join(b.text.replace("\n", " ") for b in inner)


def _rows(element):
    """The table's rows, those inside content controls (a repeating section) and custom XML too."""
    for child in element:
        name = _local(child.tag)
        if name == "tr":
            yield child
        elif name in ("sdt", "sdtContent", "customXml"):
            yield from _rows(child)


def _cells(row):
    for child in row:
        name = _local(child.tag)
        if name == "tc":
            yield child
        elif name in ("sdt", "sdtContent", "customXml"):  # a content control wrapping cells
            yield from _cells(child)


def _property(element, path: str) -> str | None:
    """The w:val of element/w:path (e.g. 'tcPr/gridSpan'), None when absent (a present w:vMerge without
    w:val says "continue": '')."""
    for step in path.split("/"):
        element = element.find(f"{_W}{step}") if element is not None else None
    return None if element is None else element.get(f"{_W}val", "")


def _table(element) -> str:
    """One line per row, cells joined by " | " (extract/tables.py). A cell merged down from the row
    above (w:vMerge) repeats that cell's text, so every row carries its label."""
    lines = []
    above: dict[int, str] = {}  # grid column -> text of the cell that starts a vertical merge there
    for row in _rows(element):
        cells: list[str] = []
        before = _property(row, "trPr/gridBefore") or ""
        column = int(before) if before.isdigit() else 0
        for cell in _cells(row):
            text = _cell_text(cell)
            merge = _property(cell, "tcPr/vMerge")
            if merge == "restart":
                above[column] = text
            elif merge is not None and not text:
                text = above.get(column, "")
            else:
                above.pop(column, None)
            cells.append(text)
            span = _property(cell, "tcPr/gridSpan") or "1"
            column += int(span) if span.isdigit() else 1
        if any(cells):
            lines.append(row_text(cells))
    return "\n".join(lines)


def _walk(container, blocks: list[Block], outline: _Outline | None = None) -> None:
    """Body blocks in order; with `outline` (the body, not a cell) each carries its heading path."""
    for child in container:
        name = _local(child.tag)
        if name == "p":
            text, boxes = _paragraph(child)
            if text:
                level = outline.level(child) if outline is not None else None
                path = outline.path.enter(level, text) if level is not None else \
                    outline.path.path if outline is not None else ()
                blocks.append(Block(text, heading=path))
            for box in boxes:
                start = len(blocks)
                _walk(box, blocks)
                for block in blocks[start:]:
                    block.heading = outline.path.path if outline is not None else ()
        elif name == "tbl":
            text = _table(child)
            if text:
                blocks.append(Block(text, heading=outline.path.path if outline is not None else ()))
        elif name in ("sdt", "sdtContent", "customXml", "ins", "smartTag"):
            _walk(child, blocks, outline)


def _strict_body(source: Source):
    """The body of a 'Strict Open XML' document, which python-docx cannot open (other relationship URIs).

    The walker above matches local names only, so the Strict namespaces need nothing else.
    """
    with check_zip(source.stream) as package:
        rels = parse_xml(read_member(package, "_rels/.rels", limit=1 << 20))
        target = next((r.get("Target") for r in rels if r.get("Type") == _STRICT_MAIN), None)
        if not target:
            return None
        main = parse_xml(read_member(package, posixpath.normpath(target.lstrip("/"))))
    return next((child for child in main if _local(child.tag) == "body"), None)


def _styles(document):
    """The styles part's root element, None when the package has none (python-docx then makes a default)."""
    from docx.opc.constants import RELATIONSHIP_TYPE as RT

    try:
        return document.part.part_related_by(RT.STYLES).element
    except (KeyError, AttributeError):
        return None


def extract_docx(source: Source) -> Extraction:
    try:
        guarded_ooxml(source.stream, ".doc")
    except LegacyBinary:  # a .doc file saved under a .docx name
        from kdbl_worker.extract.doc import extract_doc

        return extract_doc(source)
    except PackageError as exc:
        return Extraction.failed(str(exc))
    try:
        document = docx.Document(source.stream)
    except PackageNotFoundError as exc:
        return Extraction.failed(f"not a Word document: {exc}")
    except KeyError:  # no transitional officeDocument relationship: maybe Strict Open XML
        source.stream.seek(0)
        body = _strict_body(source)
        if body is None:
            return Extraction.failed("not a Word document (no main document part)")
        blocks: list[Block] = []
        _walk(body, blocks, _Outline())
        return Extraction(blocks=blocks)
    blocks = []
    _walk(document.element.body, blocks, _Outline(_styles(document)))
    title = (document.core_properties.title or "").strip() or None
    return Extraction(blocks=blocks, title=title, authors=authors.names(document.core_properties.author))
