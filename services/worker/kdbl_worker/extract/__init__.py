"""Format detection and dispatch to one extractor module per format."""

from __future__ import annotations

import logging
import mimetypes
from collections.abc import Callable
from pathlib import PurePosixPath

from kdbl_worker.extract.base import Block, Extraction, Sidecar, Source, Status

log = logging.getLogger(__name__)

Extractor = Callable[[Source], Extraction]

_MEDIA = "kdbl_worker.extract.media:extract_media"

# extension -> (content type, "module:function"); modules are imported lazily so a
# missing optional library only affects its own format.
_REGISTRY: dict[str, tuple[str, str]] = {
    ".txt": ("text/plain", "kdbl_worker.extract.text:extract_text"),
    ".text": ("text/plain", "kdbl_worker.extract.text:extract_text"),
    ".log": ("text/plain", "kdbl_worker.extract.text:extract_text"),
    ".rst": ("text/x-rst", "kdbl_worker.extract.text:extract_text"),
    ".md": ("text/markdown", "kdbl_worker.extract.markdown:extract_markdown"),
    ".markdown": ("text/markdown", "kdbl_worker.extract.markdown:extract_markdown"),
    ".html": ("text/html", "kdbl_worker.extract.html:extract_html"),
    ".htm": ("text/html", "kdbl_worker.extract.html:extract_html"),
    ".xhtml": ("application/xhtml+xml", "kdbl_worker.extract.html:extract_html"),
    ".pdf": ("application/pdf", "kdbl_worker.extract.pdf:extract_pdf"),
    ".docx": (
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
        "kdbl_worker.extract.docx:extract_docx",
    ),
    ".pptx": (
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
        "kdbl_worker.extract.pptx:extract_pptx",
    ),
    ".xlsx": (
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        "kdbl_worker.extract.xlsx:extract_xlsx",
    ),
    ".xlsm": ("application/vnd.ms-excel.sheet.macroEnabled.12", "kdbl_worker.extract.xlsx:extract_xlsx"),
    ".csv": ("text/csv", "kdbl_worker.extract.csv:extract_csv"),
    ".tsv": ("text/tab-separated-values", "kdbl_worker.extract.csv:extract_csv"),
    ".eml": ("message/rfc822", "kdbl_worker.extract.eml:extract_eml"),
    ".msg": ("application/vnd.ms-outlook", "kdbl_worker.extract.msg:extract_msg"),
    ".json": ("application/json", "kdbl_worker.extract.json_xml:extract_json"),
    ".jsonl": ("application/jsonl", "kdbl_worker.extract.json_xml:extract_jsonl"),
    ".ndjson": ("application/x-ndjson", "kdbl_worker.extract.json_xml:extract_jsonl"),
    ".xml": ("application/xml", "kdbl_worker.extract.json_xml:extract_xml"),
    ".vtt": ("text/vtt", "kdbl_worker.extract.subtitles:extract_subtitles"),
    ".srt": ("application/x-subrip", "kdbl_worker.extract.subtitles:extract_subtitles"),
    ".odt": ("application/vnd.oasis.opendocument.text", "kdbl_worker.extract.odt:extract_odt"),
    ".epub": ("application/epub+zip", "kdbl_worker.extract.epub:extract_epub"),
    ".rtf": ("application/rtf", "kdbl_worker.extract.rtf:extract_rtf"),
    # audio and video: text from a subtitle sidecar or a local transcriber (extract/media.py)
    ".mp3": ("audio/mpeg", _MEDIA),
    ".m4a": ("audio/mp4", _MEDIA),
    ".wav": ("audio/wav", _MEDIA),
    ".flac": ("audio/flac", _MEDIA),
    ".ogg": ("audio/ogg", _MEDIA),
    ".opus": ("audio/opus", _MEDIA),
    ".mp4": ("video/mp4", _MEDIA),
    ".m4v": ("video/x-m4v", _MEDIA),
    ".mkv": ("video/x-matroska", _MEDIA),
    ".webm": ("video/webm", _MEDIA),
    ".mov": ("video/quicktime", _MEDIA),
    ".avi": ("video/x-msvideo", _MEDIA),
}


def register(extension: str, content_type: str, target: str) -> None:
    """Add or replace the extractor for a file extension (lower-case, with the dot)."""
    _REGISTRY[extension.lower()] = (content_type, target)


def supported_extensions() -> dict[str, str]:
    return {ext: ctype for ext, (ctype, _) in sorted(_REGISTRY.items())}


def detect(name: str) -> tuple[str | None, str | None]:
    """Return (content_type, extractor target) for a file name, or (guess, None) if unsupported."""
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in _REGISTRY:
        return _REGISTRY[suffix]
    guessed, _ = mimetypes.guess_type(name)
    return guessed, None


def is_media(name: str) -> bool:
    """Audio or video: its text comes from a subtitle sidecar or a transcriber."""
    return detect(name)[1] == _MEDIA


def _load(target: str) -> Extractor:
    module_name, func_name = target.split(":")
    module = __import__(module_name, fromlist=[func_name])
    return getattr(module, func_name)


def extract(source: Source) -> Extraction:
    """Extract one file. Never raises for bad content: failures become a status."""
    content_type, target = detect(source.name)
    if target is None:
        return Extraction.skipped(f"unsupported format ({content_type or 'unknown type'})", content_type)
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


__all__ = ["Block", "Extraction", "Sidecar", "Source", "Status", "detect", "extract", "is_media", "register",
           "supported_extensions"]
