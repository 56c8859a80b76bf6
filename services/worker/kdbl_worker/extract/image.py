"""Images (PNG, JPEG, TIFF, WebP, BMP, GIF) through OCR (extract/ocr.py).

A multi-page TIFF gives one Block per page with its `page_no` (1-based), like a PDF; the other formats
give one Block (an animated GIF or WebP: its first frame only). Pages past `Source.ocr_max_pages`
(KDBL_OCR_MAX_PAGES), or left when `Source.ocr_budget_s` runs out, stay unread and the file is
`partial` with the reason. With OCR off for the source, or the engine not installed, the file is
`skipped` with a reason that says what to change. A broken image is `failed`, never an exception.
A page in a script that no installed OCR model reads (Chinese, say: extract/ocr.py) keeps no text and
makes the file `partial`, the reason naming the script: never garbage stored as `ok`.
"""

from __future__ import annotations

import time

from kdbl_worker.extract import ocr
from kdbl_worker.extract.base import Block, Extraction, Source

PAGED = ("TIFF",)  # frames are pages; in GIF/WebP/APNG they are an animation, in MPO (cameras) previews


def extract_image(source: Source) -> Extraction:
    if not source.ocr:
        return Extraction.skipped(ocr.OFF)
    engine = ocr.engine()
    if engine is None:
        return Extraction.skipped(ocr.NOT_INSTALLED)
    from PIL import Image

    started = time.monotonic()
    try:
        image = ocr.open_image(source.stream)
    except (OSError, ValueError, SyntaxError) as exc:  # UnidentifiedImageError is an OSError
        return Extraction.failed(f"unreadable image: {exc}")
    with image:
        paged = image.format in PAGED
        pages = getattr(image, "n_frames", 1) if paged else 1
        blocks: list[Block] = []
        problems: list[str] = []
        unread: list[int] = []  # pages in a script no installed model reads: no text kept
        unread_reason = ""
        for index in range(pages):
            if index >= source.ocr_max_pages:
                problems.append(f"OCR page limit reached: read {index} of {pages} pages (KDBL_OCR_MAX_PAGES)")
                break
            if index and source.ocr_budget_s is not None and time.monotonic() - started > source.ocr_budget_s:
                problems.append(f"OCR time budget spent: read {index} of {pages} pages in "
                                f"{source.ocr_budget_s:.0f} s (KDBL_EXTRACT_TIMEOUT_S)")
                break
            try:
                image.seek(index)
                reading = engine.read_page(image)
            except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
                problems.append(f"page {index + 1} unreadable: {exc}" if paged
                                else f"unreadable image: {exc}")
                continue
            text = reading.text
            if reading.problem:
                unread.append(index + 1)
                unread_reason = unread_reason or reading.problem
            if text:
                blocks.append(Block(text, page_no=index + 1 if paged else None))
    if unread:
        problems.insert(0, f"{unread_reason} (page {unread[0]}{f' and {len(unread) - 1} more' if len(unread) > 1 else ''})"
                        if paged else unread_reason)
        if not blocks:
            return Extraction(status="partial", reason="; ".join(problems))
    if not blocks and problems:
        return Extraction.failed("; ".join(problems))
    if not blocks:
        return Extraction.skipped("no text found by OCR")
    return Extraction(blocks=blocks, status="partial" if problems else "ok",
                      reason="; ".join(problems) or None)
