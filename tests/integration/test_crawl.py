"""Crawling a folder: statuses for bad files, incremental re-crawl, deletes, and a vanished root."""

from __future__ import annotations

import os

import pytest
from helpers import crawl, make_corpus
from sqlalchemy import text

from kdbl_core.errors import TemporaryError


def _files(owner_engine, corpus):
    with owner_engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT key, status, status_reason, chunk_count, size, mode, uid, gid, owner, content_type "
            "FROM files WHERE source_id = :s ORDER BY key"), {"s": corpus.source_id}).mappings().all()
    return {r["key"]: dict(r) for r in rows}


@pytest.fixture
def corpus(owner_engine, worker_engine, tmp_path, unique):
    return make_corpus(owner_engine, worker_engine, tmp_path / f"c-{unique}", {
        "guide.md": "# Guide\n\nInstall the widget.\n\nThen configure it.",
        "page.html": "<html><head><title>T</title><script>var x=1</script></head><body><nav>menu</nav>"
                     "<main><p>Main content here.</p></main><footer>foot</footer></body></html>",
        "notes.txt": "plain notes",
        "sub dir/na%me #1?.txt": "odd name survives",
        "binary.txt": b"\x00\x01\x02\x03 junk",
        "latin1.txt": "caf\xe9 cr\xe8me".encode("latin-1"),
        "empty.txt": b"",
        "image.png": b"\x89PNG\r\n\x1a\n....",
    }, tenant=f"crawl-{unique}")


def test_each_file_gets_a_status_and_the_crawl_goes_on(owner_engine, corpus):
    files = _files(owner_engine, corpus)
    assert files["guide.md"]["status"] == "ok" and files["guide.md"]["chunk_count"] == 1
    assert files["notes.txt"]["status"] == "ok"
    assert files["sub dir/na%me #1?.txt"]["status"] == "ok"
    assert files["binary.txt"]["status"] == "failed" and "binary" in files["binary.txt"]["status_reason"]
    assert (files["latin1.txt"]["status"], files["latin1.txt"]["status_reason"]) == (
        "ok", "encoding: windows-1252 (detected)")
    assert files["empty.txt"]["status"] == "skipped" and "empty" in files["empty.txt"]["status_reason"]
    # a PNG is read by OCR: this one is cut short after its signature
    assert files["image.png"]["status"] == "failed"
    assert files["image.png"]["status_reason"].startswith("unreadable image")


def test_posix_metadata_is_captured(owner_engine, corpus):
    meta = _files(owner_engine, corpus)["notes.txt"]
    st = os.stat(corpus.root / "notes.txt")
    assert (meta["size"], meta["mode"], meta["uid"], meta["gid"]) == (st.st_size, st.st_mode & 0o7777, st.st_uid,
                                                                      st.st_gid)
    assert meta["owner"] and meta["content_type"] == "text/plain"


def test_html_keeps_main_content_and_drops_boilerplate(owner_engine, corpus):
    with owner_engine.connect() as conn:
        body = conn.execute(text(
            "SELECT string_agg(c.text, ' ') FROM chunks c JOIN files f ON f.id = c.file_id "
            "WHERE f.source_id = :s AND f.key = 'page.html'"), {"s": corpus.source_id}).scalar()
    assert "Main content here." in body and "menu" not in body and "var x" not in body and "foot" not in body


def test_recrawl_skips_unchanged_reindexes_changed_and_drops_deleted(owner_engine, worker_engine, corpus):
    assert crawl(worker_engine, corpus).indexed == 0
    (corpus.root / "notes.txt").write_text("rewritten notes with more words")
    (corpus.root / "guide.md").rename(corpus.root / "guide-renamed.md")
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.deleted) == (2, 1)
    files = _files(owner_engine, corpus)
    assert "guide.md" not in files and files["guide-renamed.md"]["status"] == "ok"
    with owner_engine.connect() as conn:
        assert "rewritten" in conn.execute(text(
            "SELECT c.text FROM chunks c JOIN files f ON f.id = c.file_id WHERE f.source_id = :s "
            "AND f.key = 'notes.txt'"), {"s": corpus.source_id}).scalar()
        last = conn.execute(text("SELECT last_indexed_at FROM sources WHERE id = :s"),
                            {"s": corpus.source_id}).scalar()
    assert last is not None


def test_a_vanished_root_aborts_without_deleting_anything(owner_engine, worker_engine, corpus):
    before = _files(owner_engine, corpus)
    corpus.root.rename(corpus.root.with_name(corpus.root.name + "-gone"))
    with pytest.raises(TemporaryError, match="not a readable directory"):
        crawl(worker_engine, corpus)
    assert _files(owner_engine, corpus).keys() == before.keys()


def test_symlink_loops_are_recorded_not_fatal(owner_engine, worker_engine, corpus):
    with owner_engine.begin() as conn:  # loops need links followed (inside the root: issue 27)
        conn.execute(text("""UPDATE sources SET config = config || '{"follow_symlinks": true}' WHERE id = :s"""),
                     {"s": corpus.source_id})
    (corpus.root / "loop").symlink_to(corpus.root, target_is_directory=True)
    stats = crawl(worker_engine, corpus)
    assert any("loop" in why for _, why in stats.problems)
