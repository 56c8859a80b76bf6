"""The extraction contract every format module implements.

An extractor turns one file's bytes into ordered text `Block`s (with page or time
locators) plus a file-level status. It never raises for bad input: a corrupt,
encrypted or unsupported file comes back as status `failed`/`skipped` with a
reason, so the crawl goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO, Literal

if TYPE_CHECKING:
    from kdbl_worker.extract.containers import Bounds, Budget

Status = Literal["ok", "partial", "failed", "skipped"]


@dataclass(slots=True)
class Block:
    """A run of text in reading order: a paragraph, a page's text, a subtitle cue, a sheet row group."""

    text: str
    page_no: int | None = None
    ts_start_ms: int | None = None
    ts_end_ms: int | None = None
    # the enclosing headings, outermost first (a heading's own block includes it: extract/headings.py);
    # chunking turns the path of a chunk's first block into chunks.context_header
    heading: tuple[str, ...] = ()


@dataclass(slots=True)
class Extraction:
    blocks: list[Block] = field(default_factory=list)
    status: Status = "ok"
    reason: str | None = None
    content_type: str | None = None
    title: str | None = None
    authors: list[str] = field(default_factory=list)  # document properties: who wrote it (files.authors)
    tags: list[str] = field(default_factory=list)  # the file's own labels (Markdown front matter `tags`)

    @classmethod
    def failed(cls, reason: str, content_type: str | None = None) -> "Extraction":
        return cls(blocks=[], status="failed", reason=reason, content_type=content_type)

    @classmethod
    def skipped(cls, reason: str, content_type: str | None = None) -> "Extraction":
        return cls(blocks=[], status="skipped", reason=reason, content_type=content_type)


@dataclass(frozen=True, slots=True)
class Sidecar:
    """A companion file the pipeline found next to the one being extracted (the subtitles of a video)."""

    name: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Source:
    """What an extractor gets: a seekable binary stream and the file's name/declared type.

    Audio/video extractors also get the file's subtitle `sidecar` when the listing had one, and the
    folder of a local speech-to-text model (`transcriber_model`, from KDBL_TRANSCRIBER_MODEL). When the
    extractor will not read the media itself (a sidecar is there, or no transcriber is configured), the
    pipeline does not fetch it and `stream` is empty (`size` is still the file's).

    Images and PDF pages without a text layer are read by OCR when `ocr` is on (the source's config key
    `ocr`, default on), at most `ocr_max_pages` pages per file (KDBL_OCR_MAX_PAGES) and, when
    `ocr_budget_s` is set, only while the file has spent less time than that (pages left unread make the
    file `partial`, before the sandbox's per-file timeout would lose all of them).

    `bounds` and `budget` are the container bounds (KDBL_CONTAINER_*) and what the top-level file has
    spent of them so far: a single compressed file (extract/compressed.py) is bounded like an archive
    member and charges what it inflates to its top-level file (None: the defaults, a fresh budget).
    """

    stream: BinaryIO
    name: str
    size: int
    content_type: str | None = None
    sidecar: Sidecar | None = None
    transcriber_model: str | None = None
    ocr: bool = True
    ocr_max_pages: int = 200
    ocr_budget_s: float | None = None
    bounds: Bounds | None = None
    budget: Budget | None = None
