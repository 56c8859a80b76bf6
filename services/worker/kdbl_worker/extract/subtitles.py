"""WebVTT (.vtt) and SubRip (.srt): one Block per cue with ts_start_ms/ts_end_ms.

Cue text loses its markup (<i>, <b>, <c.class>, <lang>, timestamps); a WebVTT voice
span `<v Speaker>` becomes a "Speaker: " prefix so who said what stays searchable.
NOTE, STYLE and REGION blocks and cue identifiers are dropped.
"""

from __future__ import annotations

import html
import re

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode

# hh:mm:ss.mmm (hours optional in WebVTT; SubRip uses a comma and may omit leading zeros)
_TIME = r"(?:(\d+):)?(\d{1,2}):(\d{1,2})[.,](\d{1,3})"
_TIMING = re.compile(rf"^\s*{_TIME}\s*-->\s*{_TIME}")
_VOICE = re.compile(r"<v(?:\.[^\s>]*)?\s+([^>]+)>")
_TAG = re.compile(r"<[^>]*>|\{\\[^}]*\}")  # HTML-like tags; SubRip's ASS overrides such as {\an8}
_BLANK_LINES = re.compile(r"\n\s*\n")


def _ms(hours: str | None, minutes: str, seconds: str, millis: str) -> int:
    return ((int(hours or 0) * 60 + int(minutes)) * 60 + int(seconds)) * 1000 + int(millis.ljust(3, "0"))


def clean_cue_text(lines: list[str]) -> str:
    """Cue payload lines to plain text: voice names kept as a prefix, other tags removed."""
    text = " ".join(line.strip() for line in lines if line.strip())
    speakers: list[str] = []
    for match in _VOICE.finditer(text):
        name = match.group(1).strip()
        if name not in speakers:
            speakers.append(name)
    text = html.unescape(_TAG.sub("", text))
    text = " ".join(text.split())
    if speakers and text:
        text = f"{', '.join(speakers)}: {text}"
    return text


def parse_cues(text: str) -> tuple[list[Block], int]:
    """Return (cue blocks, number of unparseable timing lines) for WebVTT or SubRip text."""
    blocks: list[Block] = []
    malformed = 0
    for chunk in _BLANK_LINES.split(text.replace("\r\n", "\n").replace("\r", "\n")):
        lines = chunk.strip("\n").split("\n")
        first = lines[0].strip()
        if not first or (first.startswith(("WEBVTT", "NOTE", "STYLE", "REGION")) and "-->" not in first):
            continue
        timing_at = next((i for i, line in enumerate(lines[:2]) if "-->" in line), None)
        if timing_at is None:
            # SubRip files in the wild put blank lines inside a cue: keep that text with the cue.
            extra = clean_cue_text(lines)
            if blocks and extra and not extra.isdigit():
                blocks[-1].text = f"{blocks[-1].text} {extra}"
            continue
        match = _TIMING.match(lines[timing_at])
        if match is None:
            malformed += 1
            continue
        cue = clean_cue_text(lines[timing_at + 1 :])
        if cue:
            g = match.groups()
            blocks.append(Block(cue, ts_start_ms=_ms(*g[:4]), ts_end_ms=_ms(*g[4:])))
    return blocks, malformed


def extract_subtitles(source: Source) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    blocks, malformed = parse_cues(decoded.text)
    problems = [decoded.note] if decoded.note else []  # an encoding note alone leaves the status ok
    if malformed:
        problems.append(f"{malformed} cues with an unparseable timing line skipped")
    partial = decoded.lossy or bool(malformed)
    if not blocks:
        if partial:
            return Extraction.failed("; ".join(problems))
        return Extraction.skipped("; ".join(["no subtitle cues", *problems]))
    return Extraction(
        blocks=blocks, status="partial" if partial else "ok", reason="; ".join(problems) or None
    )
