"""PDF via pypdfium2: one Block per page (page_no 1-based), pages opened one at a time.

No OCR: a document with no text layer at all is `skipped`; pages that fail, or that
hold only images (scans), make the result `partial`. pdfium is not thread-safe:
call this from one thread per process (the worker's extraction pool uses processes).
"""

from __future__ import annotations

import re

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from kdbl_worker.extract.archive import ENCRYPTED
from kdbl_worker.extract.base import Block, Extraction, Source

MAX_PAGES = 10_000
# pdfium keeps every object it has parsed (page dictionaries, fonts, images) until the
# document is closed: reopening every so many pages keeps memory flat on huge files.
REOPEN_EVERY = 500
NO_TEXT = "no text layer (scanned?)"
# Control characters pdfium emits for hyphenation/unknown glyphs; keep \t and \n.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


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
            text = _clean(textpage.get_text_bounded())
        finally:
            textpage.close()
        return text, (not text and _has_image(page))
    finally:
        page.close()


def _title(doc: pdfium.PdfDocument) -> str | None:
    try:
        title = doc.get_metadata_dict().get("Title", "")
    except pdfium.PdfiumError:
        return None
    return " ".join(title.split()) or None


def extract_pdf(source: Source, *, max_pages: int = MAX_PAGES) -> Extraction:
    try:
        doc = pdfium.PdfDocument(source.stream, autoclose=False)
    except pdfium.PdfiumError as exc:
        if getattr(exc, "err_code", None) == pdfium_c.FPDF_ERR_PASSWORD:
            return Extraction.failed(ENCRYPTED)
        return Extraction.failed(f"unreadable PDF: {exc}")
    try:
        page_count = len(doc)
        title = _title(doc)
        blocks: list[Block] = []
        failed: list[int] = []
        scanned: list[int] = []
        first_error = ""
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
            if text:
                blocks.append(Block(text, page_no=index + 1))
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
    if not blocks:
        if problems:
            return Extraction.failed("; ".join(problems))
        return Extraction(status="skipped", reason=NO_TEXT, title=title)
    if scanned:
        problems.append(
            f"{len(scanned)} of {page_count} pages have no text layer (scanned?), first: page {scanned[0]}"
        )
    return Extraction(
        blocks=blocks,
        status="partial" if problems else "ok",
        reason="; ".join(problems) or None,
        title=title,
    )
