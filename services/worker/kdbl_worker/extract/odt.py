"""OpenDocument text (.odt) via zipfile + defusedxml: paragraphs, headings, lists and tables in order.

Frames and text boxes anchored in a paragraph become their own Blocks after it;
annotations (comments) and tracked deletions are left out. Body blocks carry the heading path above them
(extract/headings.py) from text:h and its text:outline-level (default 1); headings in table cells and
frames do not count.
"""

from __future__ import annotations

import defusedxml
import defusedxml.ElementTree as safe_et

from kdbl_worker.extract.archive import ENCRYPTED, PackageError, check_zip, read_member
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.headings import HeadingPath

_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_TABLE = "urn:oasis:names:tc:opendocument:xmlns:table:1.0"
_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_DC = "http://purl.org/dc/elements/1.1/"

_PARAGRAPHS = {f"{{{_TEXT}}}p", f"{{{_TEXT}}}h"}
_CONTAINERS = {f"{{{_TEXT}}}{n}" for n in ("list", "list-item", "list-header", "section", "index-body")}
_CONTAINERS |= {f"{{{_TEXT}}}{n}" for n in ("table-of-content", "alphabetical-index", "illustration-index")}
_SKIP = {f"{{{_OFFICE}}}annotation", f"{{{_TEXT}}}tracked-changes", f"{{{_TEXT}}}note-citation"}
_SKIP |= {
    f"{{{_TEXT}}}sequence-decls",
    f"{{{_TEXT}}}index-title-template",
    f"{{{_TEXT}}}table-of-content-source",
}
_ROW_GROUPS = {f"{{{_TABLE}}}{n}" for n in ("table-rows", "table-header-rows", "table-row-group")}


def _spaces(element) -> str:
    try:
        count = int(element.get(f"{{{_TEXT}}}c", "1"))
    except ValueError:
        count = 1
    return " " * max(1, min(count, 100))


def _inline(element, out: list[str], boxes: list) -> None:
    """A paragraph's text in order; paragraphs nested in frames go to `boxes`."""
    if element.text:
        out.append(element.text)
    for child in element:
        tag = child.tag
        if tag in _SKIP:
            pass
        elif tag == f"{{{_TEXT}}}s":
            out.append(_spaces(child))
        elif tag == f"{{{_TEXT}}}tab":
            out.append("\t")
        elif tag == f"{{{_TEXT}}}line-break":
            out.append("\n")
        elif tag in _PARAGRAPHS or tag == f"{{{_TABLE}}}table":
            boxes.append(child)
        else:
            _inline(child, out, boxes)
        if child.tail:
            out.append(child.tail)


def _rows(element):
    """Rows of one table, through row groups but not into nested tables."""
    for child in element:
        if child.tag == f"{{{_TABLE}}}table-row":
            yield child
        elif child.tag in _ROW_GROUPS:
            yield from _rows(child)


def _table(element) -> str:
    lines = []
    for row in _rows(element):
        cells = []
        for cell in row:
            if cell.tag != f"{{{_TABLE}}}table-cell":
                continue
            inner: list[Block] = []
            _walk(cell, inner)
            cells.append(" ".join(b.text.replace("\n", " ") for b in inner))
        while cells and not cells[-1]:
            cells.pop()  # spreadsheets-in-documents repeat empty cells to the sheet edge
        if cells:
            lines.append(" | ".join(cells))
    return "\n".join(lines)


def _level(heading) -> int:
    try:
        return max(1, int(heading.get(f"{{{_TEXT}}}outline-level", "1")))
    except ValueError:
        return 1


def _walk(container, blocks: list[Block], headings: HeadingPath | None = None) -> None:
    """Blocks in order; with `headings` (the body, not a cell or frame) each carries its heading path."""
    for child in container:
        tag = child.tag
        if tag in _PARAGRAPHS:
            out: list[str] = []
            boxes: list = []
            _inline(child, out, boxes)
            text = "".join(out).strip()
            path: tuple[str, ...] = ()
            if headings is not None:
                path = headings.enter(_level(child), text) if tag == f"{{{_TEXT}}}h" else headings.path
            if text:
                blocks.append(Block(text, heading=path))
            start = len(blocks)
            _walk(boxes, blocks)
            for block in blocks[start:]:
                block.heading = headings.path if headings is not None else ()
        elif tag == f"{{{_TABLE}}}table":
            text = _table(child)
            if text:
                blocks.append(Block(text, heading=headings.path if headings is not None else ()))
        elif tag in _CONTAINERS or tag.startswith("{urn:oasis:names:tc:opendocument:xmlns:drawing"):
            _walk(child, blocks, headings)


def _title(package) -> str | None:
    try:
        meta = safe_et.fromstring(read_member(package, "meta.xml", limit=8 << 20))
    except (KeyError, safe_et.ParseError, defusedxml.DefusedXmlException):
        return None
    title = meta.find(f".//{{{_DC}}}title")
    if title is None or not title.text:
        return None
    return " ".join(title.text.split()) or None


def extract_odt(source: Source) -> Extraction:
    try:
        package = check_zip(source.stream)
        with package:
            try:
                manifest = read_member(package, "META-INF/manifest.xml", limit=8 << 20)
            except KeyError:
                manifest = b""
            if b"encryption-data" in manifest:
                return Extraction.failed(ENCRYPTED)
            try:
                content = read_member(package, "content.xml")
            except KeyError:
                return Extraction.failed("not an OpenDocument file (no content.xml)")
            title = _title(package)
    except PackageError as exc:
        return Extraction.failed(str(exc))
    try:
        root = safe_et.fromstring(content)
    except safe_et.ParseError as exc:
        return Extraction.failed(f"invalid content.xml: {exc}")
    except defusedxml.DefusedXmlException as exc:
        return Extraction.failed(f"refused unsafe XML in content.xml ({type(exc).__name__})")
    body = root.find(f"{{{_OFFICE}}}body/{{{_OFFICE}}}text")
    if body is None:
        return Extraction.failed("not an OpenDocument text document (no office:text body)")
    blocks: list[Block] = []
    _walk(body, blocks, HeadingPath())
    return Extraction(blocks=blocks, title=title)
