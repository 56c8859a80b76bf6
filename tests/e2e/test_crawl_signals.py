"""SIGINT/SIGTERM end `kdbl-control crawl` and `kdbl-worker` within seconds, even mid-commit, and
nothing is half-written; without a terminal, `crawl` logs a progress line every few seconds.

Real processes, a real database. The big file's COMMIT is held up by a `pg_sleep` injected into its
last pipeline (after the rows are written, before COMMIT), so the signal lands mid-commit every time.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

from helpers import db_of
from kdbl_control import admin
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings
from kdbl_worker import jobs
from kdbl_worker.pipeline import Indexer, load_sources

# The real CLI / worker entry point, with the COMMIT of one file's transaction held up on the server.
HELD_COMMIT = """
import sys
from kdbl_core.content import store
HELD = sys.argv.pop(1)
ENTRY = sys.argv.pop(1)
_run = store.FileWriter.run

def _held(self, statements):
    if any(isinstance(p, dict) and p.get("key") == HELD for _, p in statements):
        statements = [*statements, ("SELECT pg_sleep(3600) /* held commit */", {})]
    return _run(self, statements)

store.FileWriter.run = _held
if ENTRY == "crawl":
    from kdbl_control.cli import main
else:
    from kdbl_worker.main import main
main(sys.argv[1:])
"""

# The commit is held for an hour: a stop that waited for it would take that long. The stop itself takes
# the worker's stop grace (5 s); the bound leaves a loaded machine room without blurring the difference.
HELD_BOUND_S = 60

PROGRESS = re.compile(r"kdbl: crawl \S+ .*: (\d+) listed, (\d+) indexed, \d+ unchanged, (\d+) failed, "
                      r"[\d.]+ files/s, \d+ s; now: (.*)$")


def _big_text(size: int) -> str:
    para = ("The river ran past the mill and the miller counted the sacks of grain twice before dawn. "
            "Nobody in the valley remembered a harvest like it. ") * 8
    out, n = [], 0
    while n < size:
        chunk = f"Chapter {len(out)}\n\n{para}\n\n"
        out.append(chunk)
        n += len(chunk)
    return "".join(out)


def _corpus(owner_engine, tmp_path: Path, tenant: str):
    root = tmp_path / tenant
    root.mkdir()
    for i in range(20):
        (root / f"note-{i:02d}.md").write_text(f"# Note {i}\n\nSmall file {i} about topic{i % 5}.\n")
    (root / "novel.txt").write_text(_big_text(2_000_000))
    admin.create_tenant(db_of(owner_engine), tenant)
    return admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)}, name="s")


def _held_sessions(owner_engine) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%/* held commit */%' "
                                 "AND pid <> pg_backend_pid()")).scalar()


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)
    return value


class _Lines:
    def __init__(self, stream) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.lines.put(line) for line in stream], daemon=True).start()

    def drain(self) -> list[str]:
        while True:
            try:
                self.seen.append(self.lines.get_nowait().rstrip("\n"))
            except queue.Empty:
                return self.seen


def _no_half_file(owner_engine, source_id) -> None:
    with owner_engine.connect() as conn:
        novel = conn.execute(text("SELECT count(*) FROM files WHERE source_id = :s AND key = 'novel.txt'"),
                             {"s": source_id}).scalar()
        chunks = conn.execute(text("SELECT count(*) FROM chunks c JOIN files f ON f.id = c.file_id "
                                   "WHERE f.source_id = :s AND f.key = 'novel.txt'"), {"s": source_id}).scalar()
        held = conn.execute(text("SELECT count(*) FROM crawl_items WHERE source_id = :s AND state = 'running'"),
                            {"s": source_id}).scalar()
    assert (novel, chunks, held) == (0, 0, 0)


def test_sigint_ends_a_crawl_mid_commit_within_seconds_and_progress_is_logged_without_a_terminal(
        owner_url, owner_engine, worker_engine, tmp_path, unique):
    source = _corpus(owner_engine, tmp_path, f"sig-{unique}")
    env = dict(os.environ, KDBL_DATABASE_URL=owner_url, KDBL_PROGRESS_INTERVAL_S="0.3", KDBL_LOG_LEVEL="WARNING")
    proc = subprocess.Popen([sys.executable, "-c", HELD_COMMIT, "novel.txt", "crawl", "crawl",
                             "--source", str(source.id)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    err = _Lines(proc.stderr)
    try:
        _wait(lambda: _held_sessions(owner_engine), 120, "the novel's commit to be under way")

        def progress_on_novel():
            return [m for line in err.drain()
                    if (m := PROGRESS.search(line)) and m.group(4) == "novel.txt" and m.group(2) == "20"]
        progress = _wait(progress_on_novel, 30, "a progress line naming the file in hand")
        listed, indexed, failed = map(int, progress[-1].group(1, 2, 3))
        assert (listed, indexed, failed) == (21, 20, 0)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert code == 130 and took < HELD_BOUND_S, (code, took, err.drain()[-5:])
    assert "crawl stopped" in "\n".join(err.drain())
    assert _held_sessions(owner_engine) == 0  # the held transaction was ended, not left behind
    _no_half_file(owner_engine, source.id)
    # the next crawl finishes the run and the file is indexed whole
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    stats = Indexer(db_of(worker_engine), Settings()).crawl(row)
    assert not stats.stopped
    with owner_engine.connect() as conn:
        n = conn.execute(text("SELECT chunk_count FROM files WHERE source_id = :s AND key = 'novel.txt'"),
                         {"s": source.id}).scalar()
        total = conn.execute(text("SELECT count(*) FROM files WHERE source_id = :s"), {"s": source.id}).scalar()
    assert n > 1000 and total == 21


def test_sigterm_ends_a_worker_mid_commit_within_seconds(owner_url, owner_engine, worker_engine, tmp_path,
                                                         unique):
    tenant = f"wsig-{unique}"
    source = _corpus(owner_engine, tmp_path, tenant)
    url = make_url(for_role(owner_url, "kdbl_worker")).render_as_string(hide_password=False)
    env = dict(os.environ, KDBL_DATABASE_URL=url, KDBL_LOG_LEVEL="WARNING", KDBL_LOG_FORMAT="text")
    proc = subprocess.Popen([sys.executable, "-c", HELD_COMMIT, "novel.txt", "worker", "--tenant", tenant,
                             "--no-fetch", "--no-scheduler", "--idle-poll", "0.05"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    err = _Lines(proc.stderr)
    try:
        with db_of(worker_engine).connection() as conn:
            job_id = jobs.enqueue(conn, source.id)
        _wait(lambda: _held_sessions(owner_engine), 120, "the novel's commit to be under way")
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert code == 0 and took < HELD_BOUND_S, (code, took, err.drain()[-5:])
    assert _held_sessions(owner_engine) == 0
    _no_half_file(owner_engine, source.id)
    with owner_engine.connect() as conn:  # handed back: the aborted attempt does not count
        attempts = conn.execute(text("SELECT attempts FROM crawl_items WHERE job_id = :j AND key = 'novel.txt'"),
                                {"j": job_id}).scalar()
    assert attempts == 0
