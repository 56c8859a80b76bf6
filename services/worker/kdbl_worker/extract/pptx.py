"""PowerPoint .pptx via python-pptx: one Block per slide (page_no = slide number), speaker notes included.

Shapes are read in the slide's z-order (title placeholders come first in practice),
group shapes are descended into, tables are rendered row by row, charts contribute
their title. Pictures carry no text; hidden slides are kept (their text is real).
"""

from __future__ import annotations

import pptx
from pptx.exc import PackageNotFoundError
from pptx.shapes.group import GroupShape

from kdbl_worker.extract import authors
from kdbl_worker.extract.archive import LegacyBinary, PackageError, guarded_ooxml
from kdbl_worker.extract.base import Block, Extraction, Source

_A_T = "{http://schemas.openxmlformats.org/drawingml/2006/main}t"


def _clean(text: str) -> str:
    return text.replace("\x0b", "\n").strip()  # python-pptx renders <a:br/> as vertical tab


def _raw_text(shape) -> str:
    """Fallback for shapes python-pptx cannot model: every <a:t> run in the shape's XML."""
    return " ".join(t.text.strip() for t in shape.element.iter(_A_T) if t.text and t.text.strip())


def _shape_lines(shape, out: list[str]) -> None:
    if isinstance(shape, GroupShape):
        for inner in shape.shapes:
            _shape_lines(inner, out)
        return
    if getattr(shape, "has_text_frame", False) and shape.has_text_frame:
        text = "\n".join(_clean(p.text) for p in shape.text_frame.paragraphs if p.text.strip())
        if text:
            out.append(text)
    if getattr(shape, "has_table", False) and shape.has_table:
        for row in shape.table.rows:
            cells = [" ".join(cell.text.split()) for cell in row.cells]
            if any(cells):
                out.append(" | ".join(cells))
    if getattr(shape, "has_chart", False) and shape.has_chart:
        chart = shape.chart
        if chart.has_title and chart.chart_title.has_text_frame:
            title = chart.chart_title.text_frame.text.strip()
            if title:
                out.append(title)


_SHAPE_ERRORS = (AttributeError, KeyError, ValueError, NotImplementedError)


def _slide_text(slide) -> str:
    lines: list[str] = []
    for shape in slide.shapes:
        try:
            _shape_lines(shape, lines)
        except _SHAPE_ERRORS:  # an unusual shape (bad XML, missing part) must not lose the slide
            text = _raw_text(shape)
            if text:
                lines.append(text)
    if slide.has_notes_slide:
        notes_frame = slide.notes_slide.notes_text_frame
        notes = _clean(notes_frame.text) if notes_frame is not None else ""
        if notes:
            lines.append(f"Notes: {notes}")
    return "\n".join(lines)


def _title(presentation) -> str | None:
    """The document title, else the first slide's title placeholder."""
    title = (presentation.core_properties.title or "").strip()
    if title or not len(presentation.slides):
        return title or None
    try:
        shape = presentation.slides[0].shapes.title
        text = shape.text_frame.text if shape is not None and shape.has_text_frame else ""
    except _SHAPE_ERRORS:
        return None
    return " ".join(text.split()) or None


def extract_pptx(source: Source) -> Extraction:
    try:
        guarded_ooxml(source.stream, ".ppt")
    except LegacyBinary:  # a .ppt file saved under a .pptx name
        from kdbl_worker.extract.ppt import extract_ppt

        return extract_ppt(source)
    except PackageError as exc:
        return Extraction.failed(str(exc))
    try:
        presentation = pptx.Presentation(source.stream)
    except PackageNotFoundError as exc:
        return Extraction.failed(f"not a PowerPoint presentation: {exc}")
    blocks: list[Block] = []
    problems: list[str] = []
    for number, slide in enumerate(presentation.slides, start=1):
        try:
            text = _slide_text(slide)
        except _SHAPE_ERRORS as exc:
            problems.append(f"slide {number} unreadable: {type(exc).__name__}")
            continue
        if text:
            blocks.append(Block(text, page_no=number))
    return Extraction(
        blocks=blocks,
        status="partial" if problems else "ok",
        reason="; ".join(problems[:5]) or None,
        title=_title(presentation),
        authors=authors.names(presentation.core_properties.author),
    )
