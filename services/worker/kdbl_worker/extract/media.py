"""Audio and video: text from a subtitle sidecar, else from a local speech-to-text model, else skipped.

- Sidecar: `talk.vtt`, `talk.srt` or `talk.en.vtt` next to `talk.mp4` (paired by the listing, see
  `kdbl_worker.sidecars`): its cues become the media file's blocks, with ts_start_ms/ts_end_ms; the
  media bytes are not read at all.
- Transcriber: with KDBL_TRANSCRIBER_MODEL set to a faster-whisper (CTranslate2) model folder and the
  optional faster-whisper package installed, the audio is transcribed on the CPU, one block per
  segment with its time span. The package decodes the stream with PyAV as it goes.
- Neither: status `skipped` with a reason that says what is missing.
"""

from __future__ import annotations

import io
import os
import posixpath
from functools import lru_cache
from typing import Any, BinaryIO

from kdbl_worker.extract.base import Block, Extraction, Sidecar, Source
from kdbl_worker.extract.subtitles import extract_subtitles

NO_TRANSCRIBER = "no transcriber configured (KDBL_TRANSCRIBER_MODEL) and no subtitle sidecar (.vtt/.srt)"


def reads_stream(*, has_sidecar: bool, transcriber_model: str | None) -> bool:
    """Whether extracting a media file reads its bytes (only to transcribe it)."""
    return not has_sidecar and transcriber_model is not None


def extract_media(source: Source) -> Extraction:
    if source.sidecar is not None:
        return _from_sidecar(source.sidecar)
    if source.transcriber_model is None:
        return Extraction.skipped(NO_TRANSCRIBER)
    return _transcribe(source.stream, source.transcriber_model)


def _from_sidecar(sidecar: Sidecar) -> Extraction:
    result = extract_subtitles(Source(io.BytesIO(sidecar.data), sidecar.name, len(sidecar.data)))
    note = f"from sidecar subtitles {posixpath.basename(sidecar.name)}"
    result.reason = f"{note}; {result.reason}" if result.reason else note
    return result


def _transcribe(stream: BinaryIO, model_dir: str) -> Extraction:
    if not os.path.isdir(model_dir):
        return Extraction.skipped(f"transcriber model folder {model_dir} not found (KDBL_TRANSCRIBER_MODEL)")
    try:
        model = _model(model_dir)
    except ImportError:
        return Extraction.skipped("transcriber model configured but the faster-whisper package is not "
                                  "installed")
    segments, info = model.transcribe(stream)
    blocks = [Block(text, ts_start_ms=round(seg.start * 1000), ts_end_ms=round(seg.end * 1000))
              for seg in segments if (text := seg.text.strip())]
    if not blocks:
        return Extraction.skipped("no speech recognised")
    language = getattr(info, "language", None)
    reason = f"transcribed with {posixpath.basename(model_dir.rstrip('/'))}"
    return Extraction(blocks=blocks, reason=f"{reason} (language {language})" if language else reason)


@lru_cache(maxsize=1)
def _model(model_dir: str) -> Any:
    """One loaded model per extraction process (children are long-lived)."""
    from faster_whisper import WhisperModel

    return WhisperModel(model_dir, device="cpu", compute_type="int8", local_files_only=True)
