"""PDF via pypdfium2: one Block per page (page_no 1-based), pages opened one at a time.

A page's text is rebuilt line by line from pdfium's character boxes (extract/pdf_layout.py): a table
row is one line, its cells joined by " | ", whatever order the producer wrote the cells in; text
columns keep their reading order.

Pages without a text layer that hold an image (scans) are rendered at `ocr.PDF_DPI` and read by OCR
(extract/ocr.py): their Block has the page's number like any page. At most `Source.ocr_max_pages` such
pages per file (KDBL_OCR_MAX_PAGES) and only within `Source.ocr_budget_s`; the pages left unread, like
all of them when OCR is off for the source or not installed, make the result `partial` with a reason
that says what to change (or `skipped` when no page had text). Pages without text or image (vector
drawings, text converted to outlines) are not OCRed. Pages that fail make the result `partial`, and
so do scanned pages in a script that no installed OCR model reads (their text is not kept).
A page's Block carries the heading path of the document outline (bookmarks, extract/headings.py): the
path of the last outline entry pointing at that page or an earlier one (at most MAX_OUTLINE entries).
pdfium is not thread-safe: call this from one thread per process (the worker's extraction pool uses
processes).
"""

from __future__ import annotations

import logging
import math
import re
import time

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from kdbl_worker.extract import authors, ocr, pdf_layout
from kdbl_worker.extract.archive import ENCRYPTED
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.headings import MAX_DEPTH, HeadingPath

log = logging.getLogger(__name__)

MAX_PAGES = 10_000
# pdfium keeps every object it has parsed (page dictionaries, fonts, images) until the
# document is closed: reopening every so many pages keeps memory flat on huge files.
REOPEN_EVERY = 500
NO_TEXT = "no text layer (scanned?)"
# Control characters pdfium emits for hyphenation/unknown glyphs; keep \t and \n.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
MAX_OUTLINE = 20_000  # outline entries read per file; a larger outline's tail is not used


def _clean(text: str) -> str:
    text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
    return _TRAILING_SPACE.sub("\n", text).strip()


def _has_image(page: pdfium.PdfPage) -> bool:
    return any(True for _ in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=2))


def _page_text(doc: pdfium.PdfDocument, index: int) -> tuple[str, bool]:
    """Return (text, has_image_without_text) for one page, closing what it opens."""
    page = doc[index]
    try:
        textpage = page.get_textpage()
        try:
            text = _clean(_layout_text(textpage, page))
        finally:
            textpage.close()
        return text, (not text and _has_image(page))
    finally:
        page.close()


def _layout_text(textpage: pdfium.PdfTextPage, page: pdfium.PdfPage) -> str:
    """The page's lines rebuilt from the character boxes (extract/pdf_layout.py: a table row on one line);
    pdfium's own text if that fails on a page (never lose a page to a layout bug)."""
    try:
        return pdf_layout.page_text(textpage, page.get_bbox())
    except (ValueError, IndexError, ArithmeticError) as exc:
        log.warning("pdf layout failed", extra={"error": repr(exc)[:300]})
        return textpage.get_text_bounded()


def _ocr_page(doc: pdfium.PdfDocument, index: int, engine: ocr.Engine) -> ocr.Reading:
    """Render one page (at most MAX_RENDER_PIXELS) in grey and read it."""
    page = doc[index]
    try:
        width, height = page.get_size()
        scale = min(ocr.PDF_DPI / 72, math.sqrt(ocr.MAX_RENDER_PIXELS / max(1.0, width * height)))
        bitmap = page.render(scale=scale, grayscale=True)
        try:
            image = bitmap.to_pil()
            reading = engine.read_page(image)
            return ocr.Reading(_clean(reading.text), reading.problem)
        finally:
            bitmap.close()
    finally:
        page.close()


def _properties(doc: pdfium.PdfDocument) -> tuple[str | None, list[str]]:
    """The Info dictionary's /Title and /Author (without /Author, extract_pdf reads XMP dc:creator)."""
    try:
        info = doc.get_metadata_dict()
    except pdfium.PdfiumError:
        return None, []
    return " ".join(info.get("Title", "").split()) or None, authors.names(info.get("Author"))


def _bookmark_page(doc: pdfium.PdfDocument, mark: pdfium.PdfBookmark) -> int | None:
    """The 0-based page an outline entry points at: its /Dest, else its GoTo action's (None: elsewhere)."""
    dest = mark.get_dest()
    if dest is not None:
        return dest.get_index()
    action = pdfium_c.FPDFBookmark_GetAction(mark)
    if not action or pdfium_c.FPDFAction_GetType(action) != pdfium_c.PDFACTION_GOTO:
        return None
    raw = pdfium_c.FPDFAction_GetDest(doc, action)
    index = pdfium_c.FPDFDest_GetDestPageIndex(doc, raw) if raw else -1
    return index if index >= 0 else None


def _outline(doc: pdfium.PdfDocument) -> list[tuple[int, tuple[str, ...]]]:
    """(0-based page, heading path) of each outline entry with a page, by page (outline order within one)."""
    entries: list[tuple[int, tuple[str, ...]]] = []
    headings = HeadingPath()
    try:
        for count, mark in enumerate(doc.get_toc(max_depth=MAX_DEPTH)):
            if count >= MAX_OUTLINE:
                break
            path = headings.enter(mark.level + 1, mark.get_title() or "")
            page = _bookmark_page(doc, mark)
            if page is not None and path:
                entries.append((page, path))
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - a broken outline loses the headings, never the text
        pass
    entries.sort(key=lambda entry: entry[0])
    return entries


def extract_pdf(source: Source, *, max_pages: int = MAX_PAGES) -> Extraction:
    try:
        doc = pdfium.PdfDocument(source.stream, autoclose=False)
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
            return Extraction.failed(ENCRYPTED)
        return Extraction.failed(f"unreadable PDF: {exc}")
    try:
        page_count = len(doc)
        title, by = _properties(doc)
        by = by or authors.pdf_xmp_creators(source.stream)  # pdfium has no XMP API: pypdf finds the stream
        blocks: list[Block] = []
        failed: list[int] = []
        scanned: list[int] = []  # pages with an image and no text that were not OCRed
        read: list[int] = []  # pages OCRed
        foreign: list[int] = []  # pages OCRed in a script no installed model reads: no text kept
        foreign_reason = ""
        first_error = ""
        outline, at, heading = _outline(doc), 0, ()
        engine: ocr.Engine | None = None  # loaded at the first scanned page
        started = time.monotonic()
        ocr_stop = ""  # why scanned pages are left unread from here on
        for index in range(min(page_count, max_pages)):
            if index and index % REOPEN_EVERY == 0:
                doc.close()
                doc = pdfium.PdfDocument(source.stream, autoclose=False)
            try:
                text, image_only = _page_text(doc, index)
            except pdfium.PdfiumError as exc:
                failed.append(index + 1)
                first_error = first_error or str(exc)
                continue
            if image_only and source.ocr and not ocr_stop:
                engine = engine or ocr.engine()
                if engine is None:
                    ocr_stop = ocr.NOT_INSTALLED
                elif len(read) >= source.ocr_max_pages:
                    ocr_stop = (f"OCR page limit reached: {len(read)} scanned pages read, the rest left "
                                "unread (KDBL_OCR_MAX_PAGES)")
                elif read and source.ocr_budget_s is not None and \
                        time.monotonic() - started > source.ocr_budget_s:
                    ocr_stop = (f"OCR time budget spent: {len(read)} scanned pages read in "
                                f"{source.ocr_budget_s:.0f} s, the rest left unread (KDBL_EXTRACT_TIMEOUT_S)")
                else:
                    try:
                        reading = _ocr_page(doc, index, engine)
                    except pdfium.PdfiumError as exc:
                        failed.append(index + 1)
                        first_error = first_error or str(exc)
                        continue
                    text = reading.text
                    if reading.problem:
                        foreign.append(index + 1)
                        foreign_reason = foreign_reason or reading.problem
                    read.append(index + 1)
                    image_only = False  # read: a page without text now is a picture, not a problem
            while at < len(outline) and outline[at][0] <= index:
                heading, at = outline[at][1], at + 1
            if text:
                blocks.append(Block(text, page_no=index + 1, heading=heading))
            elif image_only:
                scanned.append(index + 1)
    finally:
        doc.close()

    problems = []
    if failed:
        problems.append(
            f"{len(failed)} of {page_count} pages unreadable (first: page {failed[0]}: {first_error})"
        )
    if page_count > max_pages:
        problems.append(f"page cap reached: extracted {max_pages} of {page_count} pages")
    if page_count == 0:
        return Extraction.skipped("PDF has no pages")
    if foreign:
        problems.append(f"{len(foreign)} of {page_count} scanned pages left unread, first: page {foreign[0]}: "
                        f"{foreign_reason}")
        if not blocks:
            return Extraction(status="partial", reason="; ".join(problems), title=title, authors=by)
    unread = ocr_stop if source.ocr else ocr.OFF
    if not blocks:
        if problems:
            return Extraction.failed("; ".join(problems))
        reason = f"{NO_TEXT}; {unread}" if scanned and unread else NO_TEXT
        if read and not scanned:
            reason = f"{NO_TEXT}; OCR found no text on {len(read)} pages"
        return Extraction(status="skipped", reason=reason, title=title, authors=by)
    if scanned:
        problems.append(
            f"{len(scanned)} of {page_count} pages have no text layer (scanned?), first: page {scanned[0]}"
            + (f"; {unread}" if unread else "")
        )
    return Extraction(
        blocks=blocks,
        status="partial" if problems else "ok",
        reason="; ".join(problems) or None,
        title=title,
        authors=by,
    )
