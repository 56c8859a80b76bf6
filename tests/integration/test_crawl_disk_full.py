"""A full disk on the database server: the crawl says why, counts honestly and does not retry into it.

The disk is "full" for some keys of one source: a test-only trigger on `files` raises PostgreSQL's own
disk_full error (SQLSTATE 53100, with the message and hint a full data directory gives) from the
server, inside the real file transaction of the real pipeline. Filling a real disk would take a
tablespace on a small mount (root-only, and PostgreSQL PANICs when the WAL cannot be written); the
error class, the SQLSTATE, the transport and everything the worker does with it are the real ones.
"""

from __future__ import annotations

import logging
import threading

import pytest
from helpers import db_of, make_corpus
from sqlalchemy import text
from test_queue import assert_statistics_exact, corpus_files, job_state, wait_until

from kdbl_core.settings import Settings
from kdbl_worker import queue
from kdbl_worker.pipeline import Indexer, load_sources
from kdbl_worker.queue import DatabaseFull, QueueOptions, QueueRunner

MESSAGE = 'could not extend file "base/16384/16621.3": No space left on device'

_SETUP = [
    "CREATE TABLE kdbl_test_disk_full (source_id uuid NOT NULL, pattern text NOT NULL)",
    f"""CREATE FUNCTION kdbl_test_disk_full() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
        SET search_path = public AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM kdbl_test_disk_full f WHERE f.source_id = NEW.source_id AND NEW.key LIKE f.pattern)
        THEN
            RAISE EXCEPTION '{MESSAGE.replace("'", "''")}' USING ERRCODE = 'disk_full', HINT = 'Check free disk space.';
        END IF;
        RETURN NEW;
    END $$""",
    "CREATE TRIGGER kdbl_test_disk_full BEFORE INSERT OR UPDATE ON files FOR EACH ROW "
    "EXECUTE FUNCTION kdbl_test_disk_full()",
]
_TEARDOWN = ["DROP TRIGGER IF EXISTS kdbl_test_disk_full ON files",
             "DROP FUNCTION IF EXISTS kdbl_test_disk_full()", "DROP TABLE IF EXISTS kdbl_test_disk_full"]


class Disk:
    def __init__(self, owner_engine) -> None:
        self.engine = owner_engine

    def fill(self, source_id, pattern: str) -> None:
        """Writes of this source's files whose key is LIKE `pattern` find the disk full."""
        with self.engine.begin() as conn:
            conn.execute(text("INSERT INTO kdbl_test_disk_full VALUES (:s, :p)"), {"s": source_id, "p": pattern})

    def free(self, source_id) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM kdbl_test_disk_full WHERE source_id = :s"), {"s": source_id})


@pytest.fixture
def disk(owner_engine):
    with owner_engine.begin() as conn:
        for sql in _TEARDOWN + _SETUP:
            conn.execute(text(sql))
    try:
        yield Disk(owner_engine)
    finally:
        with owner_engine.begin() as conn:
            for sql in _TEARDOWN:
                conn.execute(text(sql))


def _items(owner_engine, source_id) -> dict[str, dict]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT i.key, i.state, i.attempts, i.breaks, i.last_error FROM crawl_items i "
                                 "WHERE i.source_id = :s ORDER BY i.id"), {"s": source_id}).mappings().all()
    return {r["key"]: dict(r) for r in rows}


def _files(owner_engine, source_id) -> dict[str, str]:
    with owner_engine.connect() as conn:
        return dict(conn.execute(text("SELECT key, status FROM files WHERE source_id = :s"), {"s": source_id}).all())


def _corpus(owner_engine, worker_engine, tmp_path, unique, files: dict[str, str]):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"full-{unique}", {}, tenant=f"full-{unique}")
    for name, body in files.items():
        (corpus.root / name).write_text(body)
    return corpus


def test_a_full_database_disk_stops_the_crawl_with_the_cause_and_leaves_its_files_queued(
        owner_engine, worker_engine, tmp_path, unique, disk, caplog):
    files = corpus_files(8, "a") | corpus_files(6, "b")
    corpus = _corpus(owner_engine, worker_engine, tmp_path, unique, files)
    disk.fill(corpus.source_id, "b-%")
    indexer = Indexer(db_of(worker_engine), Settings())
    [source] = load_sources(db_of(worker_engine), source_id=corpus.source_id)
    progress: list[int] = []
    with caplog.at_level(logging.INFO), pytest.raises(DatabaseFull) as raised:
        indexer.crawl(source, progress=lambda stats, key: progress.append(stats.indexed))

    message = raised.value.message
    assert "SQLSTATE 53100 disk_full" in message and MESSAGE in message and "Check free disk space" in message
    written = _files(owner_engine, corpus.source_id)
    assert not any(key.startswith("b-") for key in written)  # never recorded failed: nothing is the files' fault
    assert progress and progress[-1] == len(written) and f"{len(written)} files indexed" in message

    # the cause is in the log line of the file that found the disk full, and each such file is tried once
    full = [r for r in caplog.records if r.getMessage() == "writing a file failed: the database's disk is full"]
    assert 1 <= len(full) <= indexer.writers
    assert all(r.sqlstate == "53100" and MESSAGE in r.cause and r.key.startswith("b-") for r in full)
    assert not [r for r in caplog.records if r.getMessage() == "writing a file failed"]
    [stopped] = [r for r in caplog.records if r.getMessage() == "crawl stopped: the database's disk is full"]
    assert stopped.indexed == len(written) and stopped.pending == len(files) - len(written)

    items = _items(owner_engine, corpus.source_id)
    left = {k: i for k, i in items.items() if i["state"] != "done"}
    assert set(left) == set(files) - set(written)
    assert all(i["state"] == "queued" and i["attempts"] == 0 and i["breaks"] == 0 for i in left.values())
    tried = [i for i in left.values() if i["last_error"]]
    assert {r.key for r in full} == {k for k, i in left.items() if i["last_error"]}
    assert all("SQLSTATE 53100 disk_full" in i["last_error"] and MESSAGE in i["last_error"] for i in tried)

    disk.free(corpus.source_id)  # space freed: the next crawl goes on where this one stopped
    Indexer(db_of(worker_engine), Settings()).crawl(source)
    assert _files(owner_engine, corpus.source_id) == dict.fromkeys(files, "ok")
    assert_statistics_exact(owner_engine, corpus.tenant_id)


def test_a_worker_pauses_longer_each_time_the_disk_is_full_and_resumes_by_itself_once_it_is_freed(
        owner_engine, worker_engine, tmp_path, unique, disk, caplog):
    files = corpus_files(3, "b")
    corpus = _corpus(owner_engine, worker_engine, tmp_path, unique, files)
    disk.fill(corpus.source_id, "%")
    [job_id] = queue.enqueue(db_of(worker_engine), [corpus.source_id])
    indexer = Indexer(db_of(worker_engine), Settings())
    runner = QueueRunner(db_of(worker_engine), indexer, options=QueueOptions(
        lease_s=indexer.lease_s, stall_s=indexer.stall_s, scheduler=False, source_id=corpus.source_id,
        idle_poll_s=0.05, full_pause_s=0.05, full_pause_max_s=0.2))
    stop = threading.Event()
    worker = threading.Thread(target=runner.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.INFO):
        worker.start()
        try:
            def pauses():
                found = [r for r in caplog.records if r.getMessage() == "database disk full; crawling paused"]
                return found if len(found) >= 4 else None

            found = wait_until(pauses, 60, "four pauses")
            assert [r.retry_in_s for r in found[:4]] == [0.05, 0.1, 0.2, 0.2]
            assert all("SQLSTATE 53100 disk_full" in r.cause and MESSAGE in r.cause for r in found)
            assert all(i["attempts"] <= 1 and i["breaks"] == 0 and i["state"] in ("queued", "running")
                       for i in _items(owner_engine, corpus.source_id).values())  # no attempt used up
            disk.free(corpus.source_id)
            wait_until(lambda: job_state(owner_engine, job_id) == "done", 60, "the run to finish")
        finally:
            stop.set()
            worker.join(30)
            indexer.close()
    assert not worker.is_alive()
    assert _files(owner_engine, corpus.source_id) == dict.fromkeys(files, "ok")
    assert all(i["state"] == "done" for i in _items(owner_engine, corpus.source_id).values())
