"""Word .docx via python-docx: paragraphs and tables in body order, one Block each.

python-docx opens the package (its lxml parser does not resolve entities); the body is
walked here so that text boxes, content controls (w:sdt) and equation text (m:t), which
`Paragraph.text` leaves out, are kept. Headings stay as ordinary paragraphs.
"""

from __future__ import annotations

import posixpath

import docx
from docx.opc.exceptions import PackageNotFoundError
from docx.oxml import parse_xml

from kdbl_worker.extract import authors
from kdbl_worker.extract.archive import LegacyBinary, PackageError, check_zip, guarded_ooxml, read_member
from kdbl_worker.extract.base import Block, Extraction, Source

_STRICT_MAIN = "http://purl.oclc.org/ooxml/officeDocument/relationships/officeDocument"
# VML duplicates of DrawingML shapes, deleted text, field codes, the old side of a move
_SKIP = {"Fallback", "delText", "instrText", "moveFrom"}


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


def _table(element) -> str:
    lines = []
    for row in element:
        if _local(row.tag) != "tr":
            continue
        cells: list[str] = []
        for cell in row:
            if _local(cell.tag) == "tc":
                cells.append(_cell_text(cell))
            elif _local(cell.tag) == "sdt":  # a content control wrapping cells
                cells.extend(_cell_text(tc) for tc in cell.iter() if _local(tc.tag) == "tc")
        if any(cells):
            lines.append(" | ".join(cells))
    return "\n".join(lines)


def _walk(container, blocks: list[Block]) -> None:
    for child in container:
        name = _local(child.tag)
        if name == "p":
            text, boxes = _paragraph(child)
            if text:
                blocks.append(Block(text))
            for box in boxes:
                _walk(box, blocks)
        elif name == "tbl":
            text = _table(child)
            if text:
                blocks.append(Block(text))
        elif name in ("sdt", "sdtContent", "customXml", "ins", "smartTag"):
            _walk(child, blocks)


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
        _walk(body, blocks)
        return Extraction(blocks=blocks)
    blocks = []
    _walk(document.element.body, blocks)
    title = (document.core_properties.title or "").strip() or None
    return Extraction(blocks=blocks, title=title, authors=authors.names(document.core_properties.author))
