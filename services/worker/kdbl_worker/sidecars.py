"""Pairing audio/video files with the subtitle files next to them, from the listing alone.

`talk.mp4` is paired with `talk.vtt`, `talk.srt` or a language variant such as `talk.en.vtt`,
`talk.pt-BR.srt` (same folder, same stem). With several, the one without a language tag wins, then
WebVTT over SubRip, then the first key in sort order. Only listed (included) subtitle files count.

The listing knows every key only at its end, so the pipeline holds media files back until then
(`Sidecars.media`), pairs them, and queues each with its `sidecar_key`; the worker that extracts the
media reads the sidecar through the same connector. That works for every protocol. A media file that
did not change is queued again when one of its candidate subtitle files is new, changed or deleted.
Subtitle files are still indexed as files of their own.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from kdbl_core.content.records import FileMeta

SUBTITLE_SUFFIXES = (".vtt", ".srt")
_LANGUAGE = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*")  # en, eng, en-US, pt_BR, zh-Hans


def is_subtitle(key: str) -> bool:
    return key.lower().endswith(SUBTITLE_SUFFIXES)


def media_stem(key: str) -> str:
    return posixpath.splitext(key)[0]


def _stems_served(subtitle_key: str) -> tuple[str, ...]:
    """The media stems a subtitle file may belong to: `a/talk.en.vtt` -> ("a/talk.en", "a/talk")."""
    base = media_stem(subtitle_key)
    head, tag = posixpath.splitext(base)
    if tag and _LANGUAGE.fullmatch(tag[1:]) and posixpath.basename(head):
        return base, head
    return (base,)


def _preference(media: str, subtitle_key: str) -> tuple[bool, bool, str]:
    return media_stem(subtitle_key) != media, not subtitle_key.lower().endswith(".vtt"), subtitle_key


@dataclass(slots=True)
class Sidecars:
    """The subtitle files of one listing, and the media files held back until it is complete."""

    media: list[FileMeta] = field(default_factory=list)
    _by_stem: dict[str, list[str]] = field(default_factory=dict)
    _touched: set[str] = field(default_factory=set)

    def add_subtitle(self, key: str, *, changed: bool) -> None:
        for stem in _stems_served(key):
            self._by_stem.setdefault(stem, []).append(key)
        if changed:
            self.touch(key)

    def touch(self, subtitle_key: str) -> None:
        """A subtitle file is new, changed or gone: the media files it may belong to need a new extraction."""
        self._touched.update(_stems_served(subtitle_key))

    def deleted(self, keys: list[str]) -> None:
        for key in keys:
            if is_subtitle(key):
                self.touch(key)

    def touched(self, media_key: str) -> bool:
        return media_stem(media_key) in self._touched

    def sidecar_for(self, media_key: str) -> str | None:
        stem = media_stem(media_key)
        candidates = self._by_stem.get(stem)
        return min(candidates, key=lambda k: _preference(stem, k)) if candidates else None
