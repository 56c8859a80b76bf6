"""Audio/video: recognised by extension, text from a subtitle sidecar or a local transcriber, else skipped.

The media files are real (a WAV written with the stdlib `wave` module); no speech model is ever
downloaded: the transcriber path is exercised with a stand-in `faster_whisper` module.
"""

from __future__ import annotations

import io
import sys
import types
import wave
from pathlib import Path

import pytest
from kdbl_worker.extract import Sidecar, Source, detect, extract, is_media, media, supported_extensions
from kdbl_worker.sidecars import Sidecars, is_subtitle

VTT = b"""WEBVTT

00:00:01.000 --> 00:00:04.500
<v Ada>The quokka census starts at dawn.

00:01:02.250 --> 00:01:05.000
Counting ends at noon.
"""

MEDIA = {
    ".mp3": "audio/mpeg", ".m4a": "audio/mp4", ".wav": "audio/wav", ".flac": "audio/flac",
    ".ogg": "audio/ogg", ".opus": "audio/opus", ".mp4": "video/mp4", ".m4v": "video/x-m4v",
    ".mkv": "video/x-matroska", ".webm": "video/webm", ".mov": "video/quicktime", ".avi": "video/x-msvideo",
}


def write_wav(path: Path, seconds: float = 0.5) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x01" * int(8000 * seconds))
    return path


class Unreadable(io.RawIOBase):
    """A media stream that must not be read (sidecar present, or nothing could use the bytes)."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        raise AssertionError("the media bytes were read")


@pytest.fixture(autouse=True)
def _fresh_model_cache():
    media._model.cache_clear()
    yield
    media._model.cache_clear()


def test_every_audio_and_video_extension_is_recognised_with_its_content_type():
    registered = supported_extensions()
    for ext, ctype in MEDIA.items():
        assert registered[ext] == ctype
        assert is_media(f"dir/Talk{ext.upper()}") and detect(f"a{ext}")[0] == ctype
    assert not is_media("talk.vtt") and not is_media("notes.txt")


def test_media_without_sidecar_or_transcriber_is_skipped_without_reading_it():
    result = extract(Source(Unreadable(), "lecture.mp4", 10_000_000))
    assert result.status == "skipped" and result.blocks == []
    assert result.reason.startswith("no transcriber configured")
    assert result.content_type == "video/mp4"


def test_real_wav_without_sidecar_is_skipped(tmp_path):
    path = write_wav(tmp_path / "memo.wav")
    with path.open("rb") as stream:
        result = extract(Source(stream, path.name, path.stat().st_size))
    assert (result.status, result.content_type) == ("skipped", "audio/wav")
    assert "no transcriber configured" in result.reason


def test_sidecar_gives_the_media_its_text_with_timestamps(tmp_path):
    path = write_wav(tmp_path / "talk.wav")
    with path.open("rb") as stream:
        result = extract(Source(stream, path.name, path.stat().st_size,
                                sidecar=Sidecar("talks/talk.en.vtt", VTT)))
    assert result.status == "ok" and result.reason == "from sidecar subtitles talk.en.vtt"
    assert result.content_type == "audio/wav"
    assert [(b.text, b.ts_start_ms, b.ts_end_ms) for b in result.blocks] == [
        ("Ada: The quokka census starts at dawn.", 1000, 4500),
        ("Counting ends at noon.", 62250, 65000),
    ]


def test_sidecar_wins_over_a_transcriber_and_the_media_is_not_read(tmp_path):
    srt = b"1\n00:00:00,500 --> 00:00:02,000\nHello there\n"
    result = extract(Source(Unreadable(), "clip.mkv", 42, sidecar=Sidecar("clip.srt", srt),
                            transcriber_model=str(tmp_path)))
    assert result.status == "ok" and [(b.ts_start_ms, b.ts_end_ms) for b in result.blocks] == [(500, 2000)]


def test_broken_sidecar_is_reported_on_the_media_file():
    result = extract(Source(Unreadable(), "clip.mp4", 42, sidecar=Sidecar("clip.vtt", b"WEBVTT\n\n")))
    assert result.status == "skipped"
    assert result.reason == "from sidecar subtitles clip.vtt; no subtitle cues"


def test_transcriber_model_folder_missing_is_skipped_with_the_path(tmp_path):
    missing = tmp_path / "whisper-small-ct2"
    result = extract(Source(Unreadable(), "talk.mp3", 1000, transcriber_model=str(missing)))
    assert result.status == "skipped"
    assert result.reason == f"transcriber model folder {missing} not found (KDBL_TRANSCRIBER_MODEL)"


def test_transcriber_without_faster_whisper_installed_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import fails as if not installed
    result = extract(Source(io.BytesIO(b"x" * 10), "talk.mp3", 10, transcriber_model=str(tmp_path)))
    assert result.status == "skipped" and "faster-whisper package is not installed" in result.reason


def test_transcriber_segments_become_timed_blocks(tmp_path, monkeypatch):
    calls = []

    class WhisperModel:
        def __init__(self, path, **kw):
            calls.append((path, kw))

        def transcribe(self, audio):
            assert audio.read(4) == b"RIFF"  # the real file's stream, read by the decoder
            segment = types.SimpleNamespace
            return iter([segment(start=0.0, end=2.48, text=" Welcome to the quokka census."),
                         segment(start=2.48, end=3.0, text="  "),
                         segment(start=3.0, end=6.125, text=" It starts at dawn.")]), \
                types.SimpleNamespace(language="en")

    monkeypatch.setitem(sys.modules, "faster_whisper", types.SimpleNamespace(WhisperModel=WhisperModel))
    model_dir = tmp_path / "whisper-base"
    model_dir.mkdir()
    path = write_wav(tmp_path / "talk.wav")
    for _ in range(2):
        with path.open("rb") as stream:
            result = extract(Source(stream, path.name, path.stat().st_size, transcriber_model=str(model_dir)))
    assert result.status == "ok" and result.reason == "transcribed with whisper-base (language en)"
    assert [(b.text, b.ts_start_ms, b.ts_end_ms) for b in result.blocks] == [
        ("Welcome to the quokka census.", 0, 2480), ("It starts at dawn.", 3000, 6125)]
    assert len(calls) == 1 and calls[0][0] == str(model_dir)  # loaded once per process, local files only
    assert calls[0][1]["local_files_only"] is True


def test_reads_stream_only_when_transcribing():
    assert media.reads_stream(has_sidecar=False, transcriber_model="/models/whisper")
    assert not media.reads_stream(has_sidecar=True, transcriber_model="/models/whisper")
    assert not media.reads_stream(has_sidecar=False, transcriber_model=None)


# --- pairing media with sidecars from a listing ------------------------------------------------


def _pairs(keys: list[str]) -> Sidecars:
    sidecars = Sidecars()
    for key in keys:
        if is_subtitle(key):
            sidecars.add_subtitle(key, changed=False)
    return sidecars


def test_sidecar_pairing_same_folder_same_stem_with_language_variants():
    sidecars = _pairs(["a/talk.srt", "a/talk.vtt", "a/talk.en.vtt", "b/talk.vtt", "a/other.vtt",
                       "c/clip.de.srt", "c/clip.en.srt", "d/show.S01.vtt", "e/x.en-US.VTT", "f/.vtt"])
    assert sidecars.sidecar_for("a/talk.mp4") == "a/talk.vtt"  # no language tag, then WebVTT
    assert sidecars.sidecar_for("c/clip.mkv") == "c/clip.de.srt"  # first in key order
    assert sidecars.sidecar_for("e/x.wav") == "e/x.en-US.VTT"
    assert sidecars.sidecar_for("a/talk.en.mp4") == "a/talk.en.vtt"
    assert sidecars.sidecar_for("d/show.mp4") is None  # "S01" is no language tag
    assert sidecars.sidecar_for("d/show.S01.mp4") == "d/show.S01.vtt"
    assert sidecars.sidecar_for("talk.mp4") is None and sidecars.sidecar_for("g/talk.mp4") is None
    assert sidecars.sidecar_for("f/.mp4") is None


def test_a_changed_or_deleted_subtitle_touches_its_media_only():
    sidecars = Sidecars()
    sidecars.add_subtitle("a/talk.en.vtt", changed=True)
    sidecars.add_subtitle("a/other.vtt", changed=False)
    sidecars.deleted(["b/clip.srt", "b/readme.txt"])
    assert sidecars.touched("a/talk.mp4") and sidecars.touched("a/talk.en.webm")
    assert sidecars.touched("b/clip.mp4")
    assert not sidecars.touched("a/other.mp4") and not sidecars.touched("b/readme.mp4")
