"""kill -9 a real worker in the middle of a crawl; another worker takes its leases over and finishes.

Afterwards every file is indexed exactly once (files.index_runs = 1: no file lost, none written twice),
no chunk exists twice, and the BM25 statistics equal a recomputation from the postings.
"""

from __future__ import annotations

import os
import signal

from sqlalchemy import text
from test_queue import (
    assert_indexed_exactly_once,
    corpus_files,
    item_states,
    job_state,
    start_worker,
    stop_worker,
    wait_connected,
    wait_until,
)

from helpers import db_of
from kdbl_control import admin
from kdbl_worker import jobs

N_FILES = 300
LEASE_S = 2.0


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _sessions(owner_engine, name: str) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                            {"n": name}).scalar()


def test_kill_9_mid_crawl_then_another_worker_takes_over(owner_url, owner_engine, worker_engine, tmp_path,
                                                         unique):
    tenant = f"crash-{unique}"
    root = tmp_path / tenant
    root.mkdir()
    for name, body in corpus_files(N_FILES).items():
        (root / name).write_text(body)
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name="c")
    lease = ("--lease-seconds", str(LEASE_S), "--batch", "8")

    # worker A: each file transaction also sleeps 20 ms on the server, so the kill lands mid-crawl
    a = start_worker(owner_url, f"a-{unique}", tenant, tmp_path, sleep=0.02, args=lease)
    try:
        wait_connected(owner_engine, f"a-{unique}", a)
        with db_of(worker_engine).connection() as conn:
            job_id = jobs.enqueue(conn, source.id)
        wait_until(lambda: item_states(owner_engine, job_id).get("done", 0) >= 40, 60,
                   "40 files written by A")
        extractors = _children(a.pid)
        os.kill(a.pid, signal.SIGKILL)
        assert a.wait(timeout=10) == -signal.SIGKILL
    finally:
        if a.poll() is None:
            a.kill()
    # its extraction children exit with it (they watch their parent); its database sessions end once the
    # server has run what A had sent (a transaction whose COMMIT was sent still commits: A's file, A's item)
    wait_until(lambda: not any(_alive(p) for p in extractors), 10, "A's extraction processes to exit")
    wait_until(lambda: not _sessions(owner_engine, f"a-{unique}"), 30, "A's database sessions to end")
    with owner_engine.connect() as conn:
        held = {r.id: r.attempts for r in conn.execute(text(
            "SELECT id, attempts FROM crawl_items WHERE job_id = :j AND state = 'running'"), {"j": job_id})}
        done_by_a = conn.execute(text("SELECT count(*) FROM crawl_items "
                                      "WHERE job_id = :j AND state = 'done'"), {"j": job_id}).scalar()
    assert held, f"A held no lease when it was killed: {item_states(owner_engine, job_id)}"
    assert done_by_a < N_FILES

    # worker B (a plain kdbl-worker): new work at once, A's claims once their leases have expired
    b = start_worker(owner_url, f"b-{unique}", tenant, tmp_path, args=lease)
    try:
        wait_until(lambda: job_state(owner_engine, job_id) == "done", 120, "B to finish the run")
    finally:
        assert stop_worker(b) == 0

    with owner_engine.connect() as conn:
        taken = conn.execute(text(
            "SELECT id, attempts, leased_by, state FROM crawl_items WHERE id = ANY(:ids)"),
            {"ids": list(held)}).all()
        jobs_of_source = conn.execute(text("SELECT count(*) FROM crawl_jobs WHERE source_id = :s"),
                                      {"s": source.id}).scalar()
    for row in taken:  # the lease was taken over: a second attempt, by B
        assert row.state == "done" and row.attempts == held[row.id] + 1
        assert row.leased_by.split(":")[1] == str(b.pid)
    assert jobs_of_source == 1
    assert_indexed_exactly_once(owner_engine, source.id, N_FILES)
