"""Format detection and dispatch to one extractor module per format."""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import Callable

from kdbl_worker.extract import formats
from kdbl_worker.extract.base import Block, Extraction, Sidecar, Source, Status

log = logging.getLogger(__name__)

Extractor = Callable[[Source], Extraction]

# The format table lives in extract/formats.py (FORMATS): add a format there, one row.


def supported_extensions() -> dict[str, str]:
    return {ext: row.content_type for ext, row in sorted(formats.by_extension().items())}


def detect(name: str) -> tuple[str | None, str | None]:
    """Return (content_type, extractor target) for a file name, or (guess, None) if unsupported."""
    row = formats.lookup(name)
    if row is not None:
        return row.content_type, row.target
    guessed, _ = mimetypes.guess_type(name)
    return guessed, None


def is_media(name: str) -> bool:
    """Audio or video: its text comes from a subtitle sidecar or a transcriber."""
    return detect(name)[1] == formats.MEDIA


def _load(target: str) -> Extractor:
    module_name, func_name = target.split(":")
    module = __import__(module_name, fromlist=[func_name])
    return getattr(module, func_name)


def extract(source: Source) -> Extraction:
    """Extract one file. Never raises for bad content: failures become a status."""
    content_type, target = detect(source.name)
    if target is None:  # no row: text by its content, else refused after one bounded read
        target = formats.SNIFF
    if source.size == 0:
        return Extraction.skipped("empty file (0 bytes)", content_type)
    try:
        result = _load(target)(source)
    except ImportError as exc:  # an optional library is not installed
        return Extraction.skipped(f"no extractor available: {exc}", content_type)
    except Exception as exc:  # noqa: BLE001 - a broken file must not stop the crawl
        log.warning("extraction failed", extra={"file": source.name, "error": repr(exc)[:300]})
        return Extraction.failed(f"{type(exc).__name__}: {str(exc)[:300]}", content_type)
    if result.content_type is None:
        result.content_type = content_type
    if result.status == "ok" and not any(b.text.strip() for b in result.blocks):
        result.status = "skipped"
        result.reason = result.reason or "no text content"
    return result


__all__ = ["Block", "Extraction", "Sidecar", "Source", "Status", "detect", "extract", "formats", "is_media",
           "supported_extensions"]
