"""`kdbl-control crawl --queue` without a terminal: a progress line every few seconds while the worker
replicas crawl, and SIGINT stops the waiting (the runs go on in the workers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from test_queue import corpus_files, item_states, start_worker, stop_worker, wait_connected, wait_until

from helpers import db_of
from kdbl_control import admin

QUEUE_LINE = "kdbl: crawl runs "


def test_crawl_queue_logs_progress_on_a_pipe_and_sigint_stops_the_waiting(owner_url, owner_engine, tmp_path,
                                                                         unique):
    tenant = f"qp-{unique}"
    root = tmp_path / tenant
    root.mkdir()
    for name, body in corpus_files(200).items():
        (root / name).write_text(body)
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name="q")
    worker = start_worker(owner_url, f"qp-{unique}", tenant, tmp_path, sleep=0.05, args=("--batch", "4"))
    env = dict(os.environ, KDBL_DATABASE_URL=owner_url, KDBL_PROGRESS_INTERVAL_S="0.2")
    try:
        wait_connected(owner_engine, f"qp-{unique}", worker)
        waiter = subprocess.Popen([sys.executable, "-m", "kdbl_control.cli", "crawl", "--queue", "--source",
                                   str(source.id)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        lines: list[str] = []
        while len([ln for ln in lines if ln.startswith(QUEUE_LINE)]) < 2:  # ends with the pipe if it exits
            line = waiter.stderr.readline()
            assert line, f"the waiter exited without progress lines: {lines}"
            lines.append(line)
        job_id = int(waiter.stdout.readline())
        assert "listed" in lines[-1] and "pending" in lines[-1] and "files/s" in lines[-1]
        waiter.send_signal(signal.SIGINT)
        assert waiter.wait(timeout=120) == 130
        # it left at once, not when the run ended (the worker needs >= 10 s of pg_sleep for 200 files)
        assert item_states(owner_engine, job_id).get("done", 0) < 200
        assert "the runs go on in the workers" in waiter.stderr.read()
        # the worker was not disturbed: it finishes the run
        wait_until(lambda: item_states(owner_engine, job_id).get("done") == 200, 120, "the worker to finish")
    finally:
        assert stop_worker(worker) == 0
