"""Audio/video through a real crawl: subtitle sidecars give media files timed, searchable chunks.

Media files are real small files (a WAV written with the stdlib `wave` module; the MP4 is a bare
`ftyp` box, as the docs corpus has no video). No speech model is used.
"""

from __future__ import annotations

import functools
import io
import threading
import wave
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import crawl, db_of, make_corpus
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical
from kdbl_core.settings import Settings
from kdbl_worker.pipeline import Indexer, load_sources

VTT = """WEBVTT

00:00:01.000 --> 00:00:04.500
<v Ada>The quokka census starts at dawn on Rottnest.

00:01:02.250 --> 00:01:05.000
Counting ends at noon.
"""
SRT = "1\n00:00:00,500 --> 00:00:02,000\nWombat burrows are cube-shaped.\n"
MP4 = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\x00\x00\x00\x08free"


def wav_bytes(seconds: float = 0.25) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x01" * int(8000 * seconds))
    return buffer.getvalue()


FILES: dict[str, str | bytes] = {
    "talks/quokka.wav": wav_bytes(),
    "talks/quokka.en.vtt": VTT,
    "clips/wombat.mkv": MP4,
    "clips/wombat.srt": SRT,
    "lecture.mp4": MP4,
}


def _files(owner_engine, source_id) -> dict[str, dict]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT f.key, f.status, f.status_reason, f.content_type, f.chunk_count, "
            "       (SELECT json_agg(json_build_array(c.text, c.ts_start_ms, c.ts_end_ms) ORDER BY c.seq) "
            "          FROM chunks c WHERE c.file_id = f.id) AS chunks "
            "FROM files f WHERE f.source_id = :s ORDER BY f.key"), {"s": source_id}).mappings().all()
    return {r["key"]: dict(r) for r in rows}


@pytest.fixture
def corpus(owner_engine, worker_engine, tmp_path, unique):
    return make_corpus(owner_engine, worker_engine, tmp_path / f"media-{unique}", FILES,
                       tenant=f"media-{unique}")


def test_media_with_a_sidecar_gets_timed_chunks_and_without_one_is_skipped(owner_engine, corpus):
    files = _files(owner_engine, corpus.source_id)
    assert set(files) == set(FILES)
    wav = files["talks/quokka.wav"]
    assert (wav["status"], wav["content_type"]) == ("ok", "audio/wav")
    assert wav["status_reason"] == "from sidecar subtitles quokka.en.vtt"
    assert [c[1:] for c in wav["chunks"]] == [[1000, 65000]]  # both cues in one chunk: first start, last end
    assert "Ada: The quokka census starts at dawn" in wav["chunks"][0][0]
    mkv = files["clips/wombat.mkv"]
    assert (mkv["status"], mkv["content_type"], mkv["chunks"]) == (
        "ok", "video/x-matroska", [["Wombat burrows are cube-shaped.", 500, 2000]])
    lecture = files["lecture.mp4"]
    assert (lecture["status"], lecture["content_type"], lecture["chunk_count"]) == ("skipped", "video/mp4", 0)
    assert lecture["status_reason"].startswith("no transcriber configured")
    # the sidecars stay files of their own
    vtt = files["talks/quokka.en.vtt"]
    assert (vtt["status"], vtt["content_type"], vtt["chunks"][0][1]) == ("ok", "text/vtt", 1000)
    assert files["clips/wombat.srt"]["status"] == "ok"


async def test_sidecar_text_is_searchable_under_the_media_file(api_pool, corpus):
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        hits = await bm25_topk.search(conn, "quokka Rottnest", lexical.Filters(), limit=10,
                                    ts_config="english")
        videos = await bm25_topk.search(conn, "wombat burrows",
                                      lexical.Filters(content_type="video/x-matroska"), limit=10,
                                      ts_config="english")
    assert {h.key for h in hits} == {"talks/quokka.wav", "talks/quokka.en.vtt"}
    assert [h.key for h in videos] == ["clips/wombat.mkv"]


def test_adding_or_deleting_a_sidecar_re_extracts_the_unchanged_media(owner_engine, worker_engine, corpus):
    assert crawl(worker_engine, corpus).indexed == 0
    (corpus.root / "lecture.vtt").write_text(VTT.replace("quokka", "numbat"))
    (corpus.root / "talks" / "quokka.en.vtt").unlink()
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.deleted) == (3, 1)  # lecture.vtt, lecture.mp4, quokka.wav
    files = _files(owner_engine, corpus.source_id)
    assert files["lecture.mp4"]["status"] == "ok" and "numbat" in files["lecture.mp4"]["chunks"][0][0]
    assert files["lecture.mp4"]["status_reason"] == "from sidecar subtitles lecture.vtt"
    assert files["talks/quokka.wav"]["status"] == "skipped" and files["talks/quokka.wav"]["chunk_count"] == 0
    assert crawl(worker_engine, corpus).indexed == 0


def test_a_configured_transcriber_that_is_missing_skips_with_its_path(owner_engine, worker_engine, tmp_path,
                                                                     unique):
    root = tmp_path / f"tr-{unique}"
    root.mkdir()
    (root / "memo.wav").write_bytes(wav_bytes())
    (root / "talk.mp4").write_bytes(MP4)
    (root / "talk.vtt").write_text(VTT)
    tenant = f"tr-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name=root.name)
    model = tmp_path / "models" / "faster-whisper-small"
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    Indexer(db_of(worker_engine), Settings(transcriber_model=str(model), extract_processes=1)).crawl(row)
    files = _files(owner_engine, source.id)
    assert files["memo.wav"]["status"] == "skipped"
    assert files["memo.wav"]["status_reason"] == \
        f"transcriber model folder {model} not found (KDBL_TRANSCRIBER_MODEL)"
    assert files["talk.mp4"]["status"] == "ok"  # a sidecar needs no transcriber


def test_media_skipped_for_want_of_a_transcriber_is_retried_once_one_is_configured(owner_engine, worker_engine,
                                                                                  corpus, tmp_path):
    assert _files(owner_engine, corpus.source_id)["lecture.mp4"]["status_reason"].startswith("no transcriber")
    model = tmp_path / "models" / "whisper"  # configured but absent: the retry is visible in the new reason
    [row] = load_sources(db_of(worker_engine), source_id=corpus.source_id)
    indexer = Indexer(db_of(worker_engine), Settings(transcriber_model=str(model), extract_processes=1))
    assert indexer.crawl(row).indexed == 1  # only lecture.mp4: the media with sidecars did not wait for one
    lecture = _files(owner_engine, corpus.source_id)["lecture.mp4"]
    assert lecture["status_reason"] == f"transcriber model folder {model} not found (KDBL_TRANSCRIBER_MODEL)"
    assert indexer.crawl(row).indexed == 0  # a different reason now: no retry on every crawl


# -- the same over HTTP: pairing comes from the listing, the sidecar through the connector ------------------


class _Recording(SimpleHTTPRequestHandler):
    gets: list[str]

    def do_GET(self) -> None:
        self.gets.append(self.path)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def web(tmp_path) -> Iterator[tuple[str, Path, list[str]]]:
    folder = tmp_path / "web"
    for key, body in FILES.items():
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
    gets: list[str] = []
    handler = type("Handler", (_Recording,), {"gets": gets})
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", folder, gets
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_sidecars_work_over_a_remote_connector_without_downloading_the_media(owner_engine, worker_engine,
                                                                          web, unique):
    url, _, gets = web
    tenant = f"mweb-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="http",
                              config={"url": url, "base_delay": 0.01},
                              name=f"mweb-{unique}")
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    Indexer(db_of(worker_engine), Settings()).crawl(row)
    files = _files(owner_engine, source.id)
    assert files["talks/quokka.wav"]["status"] == "ok" and files["talks/quokka.wav"]["chunks"][0][1] == 1000
    assert files["clips/wombat.mkv"]["status"] == "ok"
    assert files["lecture.mp4"]["status"] == "skipped"
    assert {p for p in gets if p.endswith((".vtt", ".srt"))} >= {"/talks/quokka.en.vtt", "/clips/wombat.srt"}
    assert [p for p in gets if p.endswith((".wav", ".mkv", ".mp4"))] == []  # media bytes are never fetched
