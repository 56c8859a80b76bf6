"""The one table of supported formats: which extensions go to which extractor, as what content type.

Everything else reads this table: `extract.detect`/`extract.extract` dispatch on it, `kdbl-control formats`
prints it, and README's list of supported formats is generated from it (a unit test fails when README and
the table disagree). Extractor targets are "module:function" strings, imported lazily, so a missing optional
library only affects its own rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Format:
    """One row: a format, its extensions (lower-case, with the dot) and the extractor that reads it."""

    extensions: tuple[str, ...]
    content_type: str
    target: str  # "module:function"
    label: str  # human name, shown in README and `kdbl-control formats`
    requires: str | None = None  # install extra / system package it needs; None: the base install reads it


_P = "kdbl_worker.extract."
TEXT = _P + "text:extract_text"
MEDIA = _P + "media:extract_media"
_OOXML = "application/vnd.openxmlformats-officedocument."
_STT = "a transcriber model or a subtitle sidecar"

# THE FORMAT TABLE. To support a format, add ONE row here:
#     Format((".ext", ".ext2"), "content/type", _P + "module:function", "Human label", "extra or package"),
# The extractor is a function (Source) -> Extraction in extract/<module>.py (contract: extract/base.py).
# Then regenerate README's list with `kdbl-control formats --markdown` (test_formats_table.py checks it).
# An extension must appear in one row only (the test checks that too).
FORMATS: list[Format] = [
    Format((".txt", ".text"), "text/plain", TEXT, "Plain text"),
    Format((".log",), "text/plain", TEXT, "Log"),
    Format((".rst",), "text/x-rst", TEXT, "reStructuredText"),
    Format((".md", ".markdown"), "text/markdown", _P + "markdown:extract_markdown", "Markdown"),
    Format((".html", ".htm"), "text/html", _P + "html:extract_html", "HTML"),
    Format((".xhtml",), "application/xhtml+xml", _P + "html:extract_html", "XHTML"),
    Format((".pdf",), "application/pdf", _P + "pdf:extract_pdf", "PDF"),
    Format((".docx",), _OOXML + "wordprocessingml.document", _P + "docx:extract_docx", "Word (DOCX)"),
    Format((".pptx",), _OOXML + "presentationml.presentation", _P + "pptx:extract_pptx", "PowerPoint"),
    Format((".xlsx",), _OOXML + "spreadsheetml.sheet", _P + "xlsx:extract_xlsx", "Excel (XLSX)"),
    Format((".xlsm",), "application/vnd.ms-excel.sheet.macroEnabled.12", _P + "xlsx:extract_xlsx", "XLSM"),
    Format((".csv",), "text/csv", _P + "csv:extract_csv", "CSV"),
    Format((".tsv",), "text/tab-separated-values", _P + "csv:extract_csv", "TSV"),
    Format((".eml",), "message/rfc822", _P + "eml:extract_eml", "E-mail (EML)"),
    Format((".msg",), "application/vnd.ms-outlook", _P + "msg:extract_msg", "Outlook message (MSG)"),
    Format((".json",), "application/json", _P + "json_xml:extract_json", "JSON"),
    Format((".jsonl",), "application/jsonl", _P + "json_xml:extract_jsonl", "JSON Lines"),
    Format((".ndjson",), "application/x-ndjson", _P + "json_xml:extract_jsonl", "Newline-delimited JSON"),
    Format((".xml",), "application/xml", _P + "json_xml:extract_xml", "XML"),
    Format((".vtt",), "text/vtt", _P + "subtitles:extract_subtitles", "WebVTT subtitles"),
    Format((".srt",), "application/x-subrip", _P + "subtitles:extract_subtitles", "SubRip subtitles"),
    Format((".odt",), "application/vnd.oasis.opendocument.text", _P + "odt:extract_odt", "ODT"),
    Format((".epub",), "application/epub+zip", _P + "epub:extract_epub", "EPUB"),
    Format((".rtf",), "application/rtf", _P + "rtf:extract_rtf", "RTF"),
    # audio and video: text from a subtitle sidecar or a local transcriber (extract/media.py)
    Format((".mp3",), "audio/mpeg", MEDIA, "MP3 audio", _STT),
    Format((".m4a",), "audio/mp4", MEDIA, "M4A audio", _STT),
    Format((".wav",), "audio/wav", MEDIA, "WAV audio", _STT),
    Format((".flac",), "audio/flac", MEDIA, "FLAC audio", _STT),
    Format((".ogg",), "audio/ogg", MEDIA, "Ogg audio", _STT),
    Format((".opus",), "audio/opus", MEDIA, "Opus audio", _STT),
    Format((".mp4",), "video/mp4", MEDIA, "MP4 video", _STT),
    Format((".m4v",), "video/x-m4v", MEDIA, "M4V video", _STT),
    Format((".mkv",), "video/x-matroska", MEDIA, "Matroska video", _STT),
    Format((".webm",), "video/webm", MEDIA, "WebM video", _STT),
    Format((".mov",), "video/quicktime", MEDIA, "QuickTime video", _STT),
    Format((".avi",), "video/x-msvideo", MEDIA, "AVI video", _STT),
]


_index: dict[str, Format] | None = None


def by_extension() -> dict[str, Format]:
    """Extension -> row; later rows win (`register` appends). Built once, rebuilt after `add`."""
    global _index
    if _index is None:
        _index = {ext: row for row in FORMATS for ext in row.extensions}
    return _index


def add(row: Format) -> None:
    """Append a row at run time (what `extract.register` does); it overrides earlier rows' extensions."""
    global _index
    FORMATS.append(row)
    _index = None
