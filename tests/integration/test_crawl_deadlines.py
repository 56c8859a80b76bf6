"""No file can hang a crawl: per-file deadlines, leases that need progress, and poison files.

Real components throughout: a real Postgres row lock held by another connection, a real `pg_sleep`
injected into the file transaction of real `kdbl-worker` processes, and kill -9.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import db_of, make_corpus
import psycopg
from sqlalchemy import text
from sqlalchemy.engine import make_url
from test_queue import (
    assert_statistics_exact,
    corpus_files,
    item_states,
    job_state,
    start_worker,
    stop_worker,
    wait_connected,
    wait_until,
)

from kdbl_control import admin
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings
from kdbl_worker import jobs
from kdbl_worker.deadlines import Watchdog
from kdbl_worker.pipeline import Indexer, load_sources

# A real worker whose file transaction for one key sleeps on the server for an hour before it writes
# anything (a stand-in for any stall: the lease, the heartbeat and the queue are the real ones).
FROZEN_WORKER = """
import sys
from kdbl_core.content import store
FROZEN = sys.argv.pop(1)
_run = store.FileWriter.run

def _frozen(self, statements):
    if any(isinstance(p, dict) and p.get("key") == FROZEN for _, p in statements):
        statements = [statements[0], ("SELECT pg_sleep(3600) /* frozen */", {}), *statements[1:]]
    return _run(self, statements)

store.FileWriter.run = _frozen
from kdbl_worker.main import main
main(sys.argv[1:])
"""


def _crawl_in_thread(indexer: Indexer, source_id, worker_engine, timeout: float):
    [row] = load_sources(db_of(worker_engine), source_id=source_id)
    result: list = []
    thread = threading.Thread(target=lambda: result.append(indexer.crawl(row)), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the crawl did not return within {timeout} s"
    assert result, "the crawl raised"
    return result[0]


def test_a_write_blocked_by_a_lock_fails_at_its_deadline_and_the_crawl_goes_on(owner_engine, worker_engine,
                                                                               tmp_path, unique):
    files = corpus_files(6)
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"dl-{unique}", files, tenant=f"dl-{unique}")
    blocked = sorted(files)[2]
    for name in files:  # every file changed: the next crawl writes each one again; one gets a new word
        (corpus.root / name).write_text(files[name] + (" zanzibar" if name == blocked else " revised"))
    locker = owner_engine.connect()
    try:
        # another session holds the statistics rows of that word (every shard): the write waits on them
        locker.begin()
        per_source = locker.execute(text("SELECT count(*) FROM information_schema.columns "
                                         "WHERE table_name = 'term_stats' AND column_name = 'source_id'")).scalar()
        locker.execute(text("INSERT INTO term_stats (tenant_id, term, shard, df" + (", source_id" if per_source else "")
                            + ") SELECT :t, 'zanzibar', s, 0" + (", CAST(:s AS uuid)" if per_source else "")
                            + " FROM generate_series(0, 15) s"), {"t": corpus.tenant_id, "s": corpus.source_id})
        indexer = Indexer(db_of(worker_engine), Settings(file_deadline_s=2))
        started = time.monotonic()
        stats = _crawl_in_thread(indexer, corpus.source_id, worker_engine, timeout=60)
        took = time.monotonic() - started
    finally:
        locker.rollback()
        locker.close()
    assert (stats.indexed, stats.failed) == (5, 1)
    [(key, reason)] = [p for p in stats.problems if p[0] == blocked]
    assert "per-file deadline of 2 s" in reason
    print(f"crawl with one write blocked for good: {took:.1f} s (the file's deadline 2 s)")
    with owner_engine.connect() as conn:
        rows = {r.key: r for r in conn.execute(text(
            "SELECT key, status, status_reason, chunk_count FROM files WHERE source_id = :s"),
            {"s": corpus.source_id})}
    assert (rows[blocked].status, rows[blocked].status_reason, rows[blocked].chunk_count) == ("failed", reason, 0)
    assert all(r.status == "ok" and r.chunk_count > 0 for k, r in rows.items() if k != blocked)
    assert_statistics_exact(owner_engine, corpus.tenant_id)  # nothing half-written
    # the lock is gone: the next crawl tries the file again (a deadline may have been a passing overload)
    again = _crawl_in_thread(Indexer(db_of(worker_engine), Settings()), corpus.source_id, worker_engine, timeout=60)
    assert (again.indexed, again.unchanged, again.failed) == (1, 5, 0)
    assert_statistics_exact(owner_engine, corpus.tenant_id)


def test_the_watchdog_terminates_a_write_past_its_deadline_from_the_client_side(owner_url, worker_engine):
    # no server-side timeouts on this connection: only the watchdog can end its statement
    conn = psycopg.connect(conninfo(for_role(owner_url, "kdbl_worker")))
    overdue: list[int] = []
    watchdog = Watchdog(db_of(worker_engine), deadline_s=0.5, grace_s=0.5, on_deadline=overdue.append)
    watchdog.track(conn)  # what store.FileWriter's on_checkout does for a writer thread
    try:
        started = time.monotonic()
        with watchdog.watch(1) as ticket, pytest.raises(Exception, match="terminat"):
            conn.execute("SELECT pg_sleep(60)")
        # ended by the watchdog, well before the statement's own 60 s
        assert ticket.fired == "deadline" and time.monotonic() - started < 30
        assert overdue == [1]  # the heartbeat stops renewing that item's lease
        assert conn.broken
    finally:
        watchdog.close()
        conn.close()


def _start_frozen(owner_url: str, name: str, tenant: str, log_dir: Path, frozen: str,
                  args: tuple[str, ...]) -> subprocess.Popen:
    url = make_url(for_role(owner_url, "kdbl_worker")).update_query_dict({"application_name": name})
    env = dict(os.environ, KDBL_DATABASE_URL=url.render_as_string(hide_password=False), KDBL_LOG_LEVEL="INFO",
               KDBL_LOG_FORMAT="text", KDBL_FILE_DEADLINE_S="3600")
    command = [sys.executable, "-c", FROZEN_WORKER, frozen, "--tenant", tenant, "--no-fetch", "--no-scheduler",
               "--idle-poll", "0.05", *args]
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the worker writes it until it exits
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def _item(owner_engine, job_id: int, key: str):
    with owner_engine.connect() as conn:
        return conn.execute(text(
            "SELECT state, leased_by, attempts, breaks, started_at, last_error, "
            "lease_expires_at < now() AS expired FROM crawl_items WHERE job_id = :j AND key = :k"),
            {"j": job_id, "k": key}).first()


def test_a_stalled_worker_loses_its_lease_and_a_file_that_broke_two_workers_is_failed(
        owner_url, owner_engine, worker_engine, tmp_path, unique):
    tenant = f"poison-{unique}"
    root = tmp_path / tenant
    root.mkdir()
    files = corpus_files(10)
    files["poison.md"] = "# Poison\n\nThis file stalls every worker that writes it."
    for name, body in files.items():
        (root / name).write_text(body)
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name="p")
    args = ("--lease-seconds", "1", "--stall-seconds", "3", "--batch", "4")
    procs: list[subprocess.Popen] = []
    try:
        a = _start_frozen(owner_url, f"pa-{unique}", tenant, tmp_path, "poison.md", args)
        procs.append(a)
        wait_connected(owner_engine, f"pa-{unique}", a)
        with db_of(worker_engine).connection() as conn:
            job_id = jobs.enqueue(conn, source.id)

        # A writes the other files, then sits on poison.md: alive and beating, but its lease runs out
        def a_stalled():
            item = _item(owner_engine, job_id, "poison.md")
            return (item is not None and item_states(owner_engine, job_id).get("done") == 10
                    and item.state == "running"
                    and item.started_at is not None and item.expired)
        wait_until(a_stalled, 60, "A's lease on poison.md to expire while A is alive")
        assert a.poll() is None
        a.kill()  # kill -9, as an operator would
        a.wait(timeout=10)

        b = _start_frozen(owner_url, f"pb-{unique}", tenant, tmp_path, "poison.md", args)
        procs.append(b)

        def b_stalled():
            item = _item(owner_engine, job_id, "poison.md")
            return (item.leased_by and f":{b.pid}:" in item.leased_by and item.breaks == 1
                    and item.started_at is not None and item.expired)
        wait_until(b_stalled, 60, "B to take poison.md over and stall on it too")
        b.kill()
        b.wait(timeout=10)

        # a third worker does not take it: the file broke two workers and is recorded failed
        c = start_worker(owner_url, f"pc-{unique}", tenant, tmp_path, args=("--lease-seconds", "1"))
        procs.append(c)
        wait_until(lambda: job_state(owner_engine, job_id) == "done", 60, "the run to finish")
        assert stop_worker(c) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        with owner_engine.begin() as conn:  # the frozen sessions of the killed workers
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE query LIKE '%/* frozen */%' AND pid <> pg_backend_pid()"))
    item = _item(owner_engine, job_id, "poison.md")
    assert (item.state, item.attempts, item.breaks) == ("failed", 2, 2)
    assert item.last_error.startswith("poison file:")
    with db_of(owner_engine).connection() as conn:
        status = jobs.job_status(conn, [job_id])[job_id]
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT status, status_reason FROM files WHERE source_id = :s AND key = 'poison.md'"),
                           {"s": source.id}).one()
    assert (status.indexed, status.failed) == (10, 1)
    assert ("poison.md", item.last_error) in status.problems
    assert row.status == "failed" and row.status_reason.startswith("poison file:")


def test_the_per_file_deadline_covers_extraction_and_a_long_file_within_it_keeps_its_lease(
        owner_engine, worker_engine, tmp_path, unique):
    # ~6 MiB of empty elements: seconds of parsing (~1 MB/s here) for no text at all, so a write never
    # takes the time: before, the deadline bounded only the write and this file could take the
    # extraction timeout (120 s) on top of it
    slow = b"<html><body>" + b"<div><p></p></div>" * 350_000 + b"</body></html>"
    files = corpus_files(4)
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"dlx-{unique}", {}, tenant=f"dlx-{unique}")
    for name, body in files.items():
        (corpus.root / name).write_text(body)
    (corpus.root / "slow.html").write_bytes(slow)

    # within the deadline: a lease far shorter than the file's extraction is renewed all along
    stats = _crawl_in_thread(Indexer(db_of(worker_engine), Settings(), lease_s=0.3), corpus.source_id,
                             worker_engine, timeout=120)
    assert (stats.indexed, stats.failed) == (5, 0)
    with owner_engine.connect() as conn:
        item = conn.execute(text("SELECT attempts, breaks, state FROM crawl_items WHERE source_id = :s "
                                 "AND key = 'slow.html'"), {"s": corpus.source_id}).one()
    assert tuple(item) == (1, 0, "done")  # claimed once: never taken over while it was being extracted

    # past the deadline during extraction: failed with the reason, and the crawl goes on
    os.utime(corpus.root / "slow.html", (time.time() + 10, time.time() + 10))
    (corpus.root / "late.md").write_text("Written after the slow file: okapis.")
    stats = _crawl_in_thread(Indexer(db_of(worker_engine), Settings(file_deadline_s=1)), corpus.source_id,
                             worker_engine, timeout=120)
    assert (stats.indexed, stats.failed) == (1, 1)
    [(_, reason)] = [p for p in stats.problems if p[0] == "slow.html"]
    assert "per-file deadline of 1 s (KDBL_FILE_DEADLINE_S; extraction 1.0 s, not written)" in reason
    with owner_engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT key, status FROM files WHERE source_id = :s"),
                                 {"s": corpus.source_id}).all())
    assert rows["slow.html"] == "failed" and rows["late.md"] == "ok"
    assert_statistics_exact(owner_engine, corpus.tenant_id)
