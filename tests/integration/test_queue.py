"""The crawl queue: SKIP LOCKED claims, lease takeover and fencing, scheduling, include/exclude globs,
size/time/memory limits, two real worker processes sharing one source, and a graceful SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import POSTINGS, crawl, db_of, make_corpus, wait_until
from sqlalchemy import text
from sqlalchemy.engine import make_url

from kdbl_control import admin
from kdbl_core.content import store
from kdbl_core.content.records import Chunk, FileMeta
from kdbl_core.db.urls import for_role
from kdbl_core.settings import Settings
from kdbl_core.sources.globs import Selection
from kdbl_worker import jobs, queue
from kdbl_worker.pipeline import Indexer, load_sources
from kdbl_worker.queue import QueueOptions, QueueRunner
from kdbl_worker.sandbox import Limits, Sandbox, Task

# -- shared with test_crash.py -------------------------------------------------------------------------

# A real worker whose every file transaction also sleeps on the server (test only: it makes the work
# slow enough to be shared, stopped or killed half-way; nothing else is changed).
SLOW_WORKER = """
import sys
from kdbl_core.content import store
_write = store.FileWriter.write
SLEEP = float(sys.argv.pop(1))

def _slow(self, *, then=(), **kw):
    return _write(self, then=[("SELECT pg_sleep(%(s)s)", {"s": SLEEP}), *then], **kw)

store.FileWriter.write = _slow
from kdbl_worker.main import main
main(sys.argv[1:])
"""


def start_worker(owner_url: str, name: str, tenant: str, log_dir: Path, *, sleep: float | None = None,
                 args: tuple[str, ...] = ()) -> subprocess.Popen:
    """A real `kdbl-worker` process for one tenant, connected as kdbl_worker (application_name=name)."""
    url = make_url(for_role(owner_url, "kdbl_worker")).update_query_dict({"application_name": name})
    env = dict(os.environ, KDBL_DATABASE_URL=url.render_as_string(hide_password=False),
               KDBL_LOG_LEVEL="WARNING", KDBL_LOG_FORMAT="text")
    entry = ["-m", "kdbl_worker.main"] if sleep is None else ["-c", SLOW_WORKER, str(sleep)]
    command = [sys.executable, *entry, "--tenant", tenant, "--no-fetch", "--no-scheduler",
               "--idle-poll", "0.05", *args]
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the worker writes it until it exits
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_connected(owner_engine, name: str, proc: subprocess.Popen, timeout: float = 60) -> None:
    def connected() -> bool:
        assert proc.poll() is None, f"worker {name} exited with {proc.returncode}"
        with owner_engine.connect() as conn:
            return bool(conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                {"n": name}).scalar())
    wait_until(connected, timeout, f"worker {name} to connect")


def stop_worker(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        raise AssertionError("worker did not stop in time") from None


def item_states(owner_engine, job_id: int) -> dict[str, int]:
    with owner_engine.connect() as conn:
        return dict(conn.execute(
            text("SELECT state, count(*) FROM crawl_items WHERE job_id = :j GROUP BY state"),
            {"j": job_id}).all())


def job_state(owner_engine, job_id: int) -> str:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT state FROM crawl_jobs WHERE id = :j"), {"j": job_id}).scalar()


def assert_indexed_exactly_once(owner_engine, source_id, n_files: int) -> None:
    """Every file written once (index_runs), no twin chunks, and BM25 statistics equal to the postings."""
    with owner_engine.connect() as conn:
        files = conn.execute(text(
            "SELECT count(*) AS n, count(*) FILTER (WHERE index_runs = 1) AS once, "
            "count(*) FILTER (WHERE status = 'ok') AS ok, sum(chunk_count) AS chunks, "
            "min(tenant_id::text) AS tenant_text "
            "FROM files WHERE source_id = :s"), {"s": source_id}).one()
        chunks = conn.execute(text("SELECT count(*) AS n, count(DISTINCT (file_id, seq)) AS distinct_ "
                                   "FROM chunks WHERE source_id = :s"), {"s": source_id}).one()
    assert (files.n, files.once, files.ok) == (n_files, n_files, n_files)
    assert chunks.n == chunks.distinct_ == files.chunks
    assert_statistics_exact(owner_engine, uuid.UUID(files.tenant_text))


def assert_statistics_exact(owner_engine, tenant: uuid.UUID) -> None:
    """df per term, N and total length recomputed from postings/chunks equal the sharded counters."""
    with owner_engine.connect() as conn:
        drift = conn.execute(text(f"""
            WITH truth AS (SELECT term, count(*) AS df FROM {POSTINGS} p WHERE tenant_id = :t GROUP BY term),
                 kept AS (SELECT term, sum(df) AS df FROM term_stats WHERE tenant_id = :t GROUP BY term)
            SELECT count(*) FROM truth FULL JOIN kept USING (term)
             WHERE coalesce(truth.df, 0) <> coalesce(kept.df, 0)"""), {"t": tenant}).scalar()
        kept = conn.execute(
            text("SELECT sum(n_chunks), sum(total_len) FROM corpus_stats WHERE tenant_id = :t"),
            {"t": tenant}).one()
        truth = conn.execute(text("SELECT count(*), sum(token_count) FROM chunks WHERE tenant_id = :t"),
                             {"t": tenant}).one()
        orphans = conn.execute(text(
            "SELECT count(*) FROM postings p WHERE p.tenant_id = :t "
            "AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.id = p.chunk_id)"), {"t": tenant}).scalar()
    assert drift == 0 and orphans == 0
    assert tuple(kept) == tuple(truth)


def corpus_files(n: int, prefix: str = "doc") -> dict[str, str]:
    return {f"{prefix}-{i:03d}.md": f"# Note {i}\n\nTopic {i % 7} and term{i} appear in document {i}. " * 3
            for i in range(n)}


# -- the queue's SQL, driven directly ------------------------------------------------------------------

@pytest.fixture
def empty_source(owner_engine, tmp_path, unique):
    root = tmp_path / f"q-{unique}"
    root.mkdir()
    admin.create_tenant(db_of(owner_engine), f"q-{unique}")
    return admin.add_source(db_of(owner_engine), f"q-{unique}", protocol="fs", config={"root": str(root)},
                            name="q")


def _listed_job(worker_engine, source, n_items: int, lease_s: float = 60) -> jobs.JobClaim:
    with db_of(worker_engine).connection() as conn:
        jobs.enqueue(conn, source.id)
    with db_of(worker_engine).connection() as conn:
        job = jobs.claim_job(conn, "lister", lease_s=lease_s, max_attempts=5, source_id=source.id)
    assert job is not None and job.lease.attempt == 1
    with db_of(worker_engine).connection() as conn:
        jobs.add_items(conn, job.id, job.lease, [jobs.ItemRow(FileMeta(f"f{i}.txt", 10)) for i in range(n_items)])
        jobs.add_items(conn, job.id, job.lease, [jobs.ItemRow(FileMeta("f0.txt", 10))])  # a re-listing adds no twin
    with db_of(worker_engine).connection() as conn:
        jobs.lock_listing(conn, job.id, job.lease)
        jobs.finish_listing(conn, job.id, job.lease, listed=n_items, excluded=0, unchanged=0, deleted=0,
                            problems=[])
    return job


def test_a_claimed_item_hands_back_the_file_record_its_listing_queued(worker_engine, empty_source):
    listed = FileMeta("docs/a.md", 1234, datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "etag-1", "STANDARD", "ann",
                      0o100644, 1000, 100)
    with db_of(worker_engine).connection() as conn:
        jobs.enqueue(conn, empty_source.id)
        job = jobs.claim_job(conn, "rec-lister", lease_s=60, max_attempts=5, source_id=empty_source.id)
        jobs.add_items(conn, job.id, job.lease, [jobs.ItemRow(listed, had_file=False, sidecar_key="docs/a.srt")])
        jobs.finish_listing(conn, job.id, job.lease, listed=1, excluded=0, unchanged=0, deleted=0, problems=[])
        [item] = jobs.claim_items(conn, "rec-w", n=5, lease_s=60, max_attempts=5, source_id=empty_source.id)
    assert (item.file, item.had_file, item.sidecar_key) == (listed, False, "docs/a.srt")


def test_concurrent_claims_skip_each_others_rows(worker_engine, empty_source):
    job = _listed_job(worker_engine, empty_source, 30)
    with db_of(worker_engine).connection() as a, db_of(worker_engine).connection() as b:
        first = jobs.claim_items(a, "a", n=20, lease_s=60, max_attempts=5, source_id=empty_source.id)
        # a has not committed: its 20 rows are locked and skipped, not waited for
        second = jobs.claim_items(b, "b", n=20, lease_s=60, max_attempts=5, source_id=empty_source.id)
    assert (len(first), len(second)) == (20, 10)
    assert not {i.file.key for i in first} & {i.file.key for i in second}
    with db_of(worker_engine).connection() as conn:
        assert jobs.claim_items(conn, "c", n=5, lease_s=60, max_attempts=5, source_id=empty_source.id) == []
        assert jobs.finalize(conn, empty_source.id) == []  # 30 items still running
    assert job_state(worker_engine, job.id) == "running"


def test_an_expired_lease_is_taken_over_and_the_old_holder_is_fenced_off(owner_engine, worker_engine,
                                                                         empty_source):
    job = _listed_job(worker_engine, empty_source, 1, lease_s=60)
    with db_of(worker_engine).connection() as conn:
        [mine] = jobs.claim_items(conn, "crashed", n=5, lease_s=60, max_attempts=5, source_id=empty_source.id)
    with db_of(worker_engine).connection() as conn:  # a live lease is not claimable
        assert not jobs.claim_items(conn, "other", n=5, lease_s=60, max_attempts=5, source_id=empty_source.id)
    with owner_engine.begin() as conn:  # time passes: the holder stopped renewing
        conn.execute(text("UPDATE crawl_items SET lease_expires_at = now() - interval '1 second' "
                          "WHERE id = :i"), {"i": mine.id})
    with db_of(worker_engine).connection() as conn:
        assert jobs.heartbeat(conn, "other", lease_s=60) == 0
        [taken] = jobs.claim_items(conn, "other", n=5, lease_s=60, max_attempts=5, source_id=empty_source.id)
    assert (taken.id, taken.lease.attempt) == (mine.id, 2)
    with db_of(worker_engine).connection() as conn, pytest.raises(jobs.LeaseLost):
        jobs.complete_item(conn, mine.id, mine.lease, status="ok", chunks=1)  # the old holder cannot commit
    with db_of(worker_engine).connection() as conn:
        jobs.complete_item(conn, taken.id, taken.lease, status="ok", chunks=1)
        assert jobs.finalize(conn, empty_source.id) == [job.id]
    assert job_state(worker_engine, job.id) == "done"


def test_a_pipelined_file_write_commits_only_with_its_lease(owner_engine, worker_engine, empty_source):
    """The file transaction is sent with its COMMIT in one round trip: a lost lease must still veto it."""
    job = _listed_job(worker_engine, empty_source, 1)
    with db_of(worker_engine).connection() as conn:
        [mine] = jobs.claim_items(conn, "slow", n=1, lease_s=60, max_attempts=5, source_id=empty_source.id)
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE crawl_items SET lease_expires_at = now() - interval '1 second' "
                          "WHERE id = :i"), {"i": mine.id})
    with db_of(worker_engine).connection() as conn:
        [taken] = jobs.claim_items(conn, "fast", n=1, lease_s=60, max_attempts=5, source_id=empty_source.id)
    writer = store.FileWriter(db_of(worker_engine))
    chunks = [Chunk(0, "alpha beta gamma", 0, 16)]

    def write(claim: jobs.ItemClaim, body: list[Chunk], replace: bool) -> None:
        writer.write(tenant_id=empty_source.tenant_id, source_id=empty_source.id,
                     meta=FileMeta(key=claim.file.key, size=10), status="ok", status_reason=None,
                     title=None, chunks=body, text_chars=16, ts_config="english", replace=replace,
                     durable=False,
                     then=[jobs.complete_item_statement(claim.id, claim.lease, status="ok",
                                                        chunks=len(body))])

    try:
        with pytest.raises(store.FenceLost, match="lease lost"):
            write(mine, chunks, replace=False)
        with owner_engine.connect() as conn:  # vetoed: nothing of it was written
            assert conn.execute(text("SELECT count(*) FROM files WHERE source_id = :s"),
                                {"s": empty_source.id}).scalar() == 0
        write(taken, chunks, replace=False)
        # a wrong "new file" hint on a file that has content costs a retry, never correctness
        with db_of(worker_engine).connection() as conn:
            jobs.release_item(conn, taken.id, taken.lease)  # (reuse the item: queue it again)
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE crawl_items SET state = 'queued' WHERE id = :i"), {"i": taken.id})
        with db_of(worker_engine).connection() as conn:
            [again] = jobs.claim_items(conn, "fast", n=1, lease_s=60, max_attempts=5,
                                       source_id=empty_source.id)
        write(again, [Chunk(0, "delta", 0, 5), Chunk(1, "epsilon", 7, 14)],
              replace=False)
    finally:
        writer.close()
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT index_runs, chunk_count FROM files WHERE source_id = :s"),
                           {"s": empty_source.id}).one()
        terms = conn.execute(text(f"SELECT string_agg(term, ',' ORDER BY term) FROM {POSTINGS} p "
                                  "WHERE source_id = :s"), {"s": empty_source.id}).scalar()
    # each chunk: its word and its file's name ("f0": f0, f, 0; kdbl_core.content.analysis)
    assert tuple(row) == (2, 2) and terms == "0,0,delta,epsilon,f,f,f0,f0"
    assert_statistics_exact(owner_engine, empty_source.tenant_id)
    assert job_state(owner_engine, job.id) == "running"


def _round_trips(trace) -> int:
    """Round trips in a libpq trace: one per Sync or simple Query the client sent."""
    trace.seek(0)
    sent = [line.split("\t") for line in trace.read().splitlines()]
    return sum(1 for f in sent if len(f) > 2 and f[0] == "F" and f[2] in ("Sync", "Query"))


def test_a_file_transaction_and_its_commit_take_one_round_trip(owner_engine, worker_engine, empty_source):
    """BEGIN, the tenant setting, the drop, the write, the item's fenced completion and COMMIT: one round
    trip on the wire (psycopg's own BEGIN would wait for its answer first: two)."""
    job = _listed_job(worker_engine, empty_source, 2)
    with db_of(worker_engine).connection() as conn:
        claims = jobs.claim_items(conn, "rt", n=2, lease_s=60, max_attempts=5, source_id=empty_source.id)
    taken: list = []
    writer = store.FileWriter(db_of(worker_engine), on_checkout=taken.append)

    def write(claim: jobs.ItemClaim) -> None:
        writer.write(tenant_id=empty_source.tenant_id, source_id=empty_source.id, meta=claim.file, status="ok",
                     status_reason=None, title=None, chunks=[Chunk(0, "alpha beta gamma", 0, 16)], text_chars=16,
                     ts_config="english", replace=True, durable=False,
                     then=[jobs.complete_item_statement(claim.id, claim.lease, status="ok", chunks=1)])

    try:
        write(claims[0])  # the writer takes its connection
        with tempfile.TemporaryFile("w+") as trace:
            taken[0].pgconn.trace(os.dup(trace.fileno()))
            taken[0].pgconn.set_trace_flags(1)  # psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
            try:
                write(claims[1])
            finally:
                taken[0].pgconn.untrace()
            trips = _round_trips(trace)
    finally:
        writer.close()
    assert trips == 1
    with owner_engine.connect() as conn:
        done = conn.execute(text("SELECT count(*) FROM crawl_items WHERE job_id = :j AND state = 'done'"),
                            {"j": job.id}).scalar()
    assert done == 2 and len(taken) == 1
    assert_statistics_exact(owner_engine, empty_source.tenant_id)
    with db_of(worker_engine).connection() as conn:  # the connection went back to the pool as it came
        assert not conn.autocommit


def test_leases_expiring_too_often_give_up(owner_engine, worker_engine, empty_source):
    job = _listed_job(worker_engine, empty_source, 1)
    for attempt in range(1, 3):
        with db_of(worker_engine).connection() as conn:
            [item] = jobs.claim_items(conn, f"w{attempt}", n=1, lease_s=60, max_attempts=2,
                                      source_id=empty_source.id)
        assert item.lease.attempt == attempt
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE crawl_items SET lease_expires_at = now() - interval '1 second'"
                              " WHERE job_id = :j"), {"j": job.id})
    with db_of(worker_engine).connection() as conn:
        assert jobs.claim_items(conn, "w3", n=1, lease_s=60, max_attempts=2, source_id=empty_source.id) == []
        assert [g.file.key for g in jobs.sweep(conn, max_attempts=2)] == ["f0.txt"]
        assert jobs.finalize(conn, empty_source.id) == [job.id]
    with db_of(worker_engine).connection() as conn:
        status = jobs.job_status(conn, [job.id])[job.id]
    assert (status.state, status.failed, status.indexed) == ("done", 1, 0)


def test_the_heartbeat_renews_only_progressing_work_and_a_file_that_broke_two_holders_is_given_up(
        owner_engine, worker_engine, empty_source):
    job = _listed_job(worker_engine, empty_source, 3)
    with db_of(worker_engine).connection() as conn:
        first, second, third = jobs.claim_items(conn, "w", n=3, lease_s=60, max_attempts=5,
                                                source_id=empty_source.id)

    def expire(seconds: int = -1) -> None:
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE crawl_items SET lease_expires_at = now() + make_interval(secs => :s) "
                              "WHERE job_id = :j"), {"s": seconds, "j": job.id})

    def rows() -> dict[str, tuple]:
        with owner_engine.connect() as conn:
            return {r.key: (r.breaks, r.started_at is not None, r.renewed) for r in conn.execute(text(
                "SELECT key, breaks, started_at, lease_expires_at > now() + interval '30 seconds' AS renewed "
                "FROM crawl_items WHERE job_id = :j"), {"j": job.id})}

    expire(1)
    with db_of(worker_engine).connection() as conn:  # progress: all renewed but the overdue one; the one in hand stamped
        assert jobs.heartbeat(conn, "w", lease_s=60, started=[first.id], overdue=[second.id]) == 2
    assert rows() == {first.file.key: (0, True, True), second.file.key: (0, False, False), third.file.key: (0, False, True)}
    expire(1)
    with db_of(worker_engine).connection() as conn:  # no progress: nothing renewed
        assert jobs.heartbeat(conn, "w", lease_s=60, renew=False, started=[first.id]) == 0
    expire()
    with db_of(worker_engine).connection() as conn:  # taken over: the started item counts a break, the others do not
        taken = jobs.claim_items(conn, "x", n=3, lease_s=60, max_attempts=5, source_id=empty_source.id)
        assert [t.lease.attempt for t in taken] == [2, 2, 2]
        jobs.heartbeat(conn, "x", lease_s=60, started=[first.id])
    assert {k: v[:2] for k, v in rows().items()} == {first.file.key: (1, True), second.file.key: (0, False),
                                                    third.file.key: (0, False)}
    expire()
    with db_of(worker_engine).connection() as conn:  # the second break: not claimed again, given up as a poison file
        assert {t.file.key for t in jobs.claim_items(conn, "y", n=3, lease_s=60, max_attempts=5,
                                                source_id=empty_source.id)} == {second.file.key, third.file.key}
        [given_up] = jobs.sweep(conn, max_attempts=5)
    assert given_up.file.key == first.file.key and given_up.reason.startswith("poison file:")


def test_enqueue_joins_a_queued_run_and_queues_behind_an_active_one(worker_engine, empty_source):
    with pytest.raises(TimeoutError, match="still open"):  # nobody serves the queue in this test
        queue.wait_for(db_of(worker_engine), queue.enqueue(db_of(worker_engine), [empty_source.id]), timeout_s=0.1,
                       poll_s=0.05)
    with db_of(worker_engine).connection() as conn:
        first = jobs.enqueue(conn, empty_source.id)
        assert jobs.enqueue(conn, empty_source.id) == first
    with db_of(worker_engine).connection() as conn:
        claim = jobs.claim_job(conn, "a", lease_s=60, max_attempts=5, source_id=empty_source.id)
        assert claim.id == first
    with db_of(worker_engine).connection() as conn:
        second = jobs.enqueue(conn, empty_source.id)
        assert second != first
        # one run per source at a time: the queued one waits for the listing one
        assert jobs.claim_job(conn, "b", lease_s=60, max_attempts=5, source_id=empty_source.id) is None


def test_the_worker_role_sees_only_the_tenant_of_its_transaction(owner_engine, worker_engine, tmp_path,
                                                                  unique):
    from kdbl_core.access.principal import tenant_transaction

    sources = []
    for name in ("a", "b"):
        root = tmp_path / f"{name}-{unique}"
        root.mkdir()
        admin.create_tenant(db_of(owner_engine), f"{name}-{unique}")
        sources.append(admin.add_source(db_of(owner_engine), f"{name}-{unique}", protocol="fs",
                                        config={"root": str(root)}, name=name))
        _listed_job(worker_engine, sources[-1], 2)
    with worker_engine.connect() as conn:  # no tenant: the queue of every tenant (claims)
        seen = conn.execute(text("SELECT count(*) FROM crawl_items WHERE source_id = ANY(:s)"),
                            {"s": [s.id for s in sources]}).scalar()
    assert seen == 4
    with tenant_transaction(db_of(worker_engine), sources[0].tenant_id) as conn:
        rows = conn.execute("SELECT DISTINCT source_id FROM crawl_items WHERE source_id = ANY(%(s)s)",
                            {"s": [s.id for s in sources]}).fetchall()
        assert [r.source_id for r in rows] == [sources[0].id]
        changed = conn.execute("UPDATE crawl_items SET last_error = 'x' WHERE source_id = %(s)s",
                               {"s": sources[1].id}).rowcount
        assert changed == 0


def test_schedules_queue_one_run_per_slot(owner_engine, worker_engine, tmp_path, unique):
    tenant = f"sch-{unique}"
    admin.create_tenant(db_of(owner_engine), tenant)
    made = {}
    for name, schedule in (("hourly", "@hourly"), ("manual", "manual"), ("default", None),
                           ("bad", "@weekdays"), ("daily", "@daily")):
        root = tmp_path / f"{name}-{unique}"
        root.mkdir()
        made[name] = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                                      name=name, schedule=schedule)
    with db_of(worker_engine).connection() as conn:  # an on-demand run made after today's slot serves the daily one
        jobs.enqueue(conn, made["daily"].id)
    runners = [QueueRunner(db_of(worker_engine), Indexer(db_of(worker_engine), Settings()),
                           options=QueueOptions(tenants=(tenant,))) for _ in range(2)]
    with owner_engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar()
    queued = runners[0].schedule_due(now) + runners[1].schedule_due(now)  # two replicas, same slot
    assert len(queued) == 2
    assert _jobs_by_source(owner_engine, made) == {"hourly": 1, "default": 1, "daily": 1}
    # two slots later (the runs above were created before it): the hourly source again, once; the default
    # one's run is still queued, and a source has at most one queued run
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE crawl_jobs SET state = 'done', finished_at = now() WHERE source_id = :s"),
                     {"s": made["hourly"].id})
    later = now + timedelta(hours=2)
    assert len(runners[1].schedule_due(later)) == 1 and runners[0].schedule_due(later) == []
    assert _jobs_by_source(owner_engine, made) == {"hourly": 2, "default": 1, "daily": 1}


def _jobs_by_source(owner_engine, made) -> dict[str, int]:
    names = {s.id: n for n, s in made.items()}
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT source_id, count(*) FROM crawl_jobs WHERE source_id = ANY(:s) "
                                 "GROUP BY source_id"), {"s": list(names)}).all()
    return {names[sid]: n for sid, n in rows}


# -- selection and limits ------------------------------------------------------------------------------

def test_glob_semantics():
    sel = Selection.of(include=["docs/**", "*.md"], exclude=["**/drafts/", "secret?.txt", "[._]*"])
    assert sel("docs/a/b.txt") and sel("readme.md") and sel("x/y/z.md")
    assert not sel("src/main.py")  # not included
    assert not sel("docs/drafts/a.txt") and not sel("notes/drafts/x.md")  # excluded directory
    assert not sel("docs/secret1.txt") and sel("docs/secret12.txt")
    assert not sel("docs/.hidden.md") and not sel("_x.md")
    assert Selection.of()("anything/at/all")
    assert Selection.of(include=["**/*.md"])("top.md")
    assert not Selection.of(include=["docs/*.md"])("docs/sub/a.md")


def test_include_exclude_and_size_limit_in_a_crawl(owner_engine, worker_engine, tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"g-{unique}", {
        "docs/guide.md": "# Guide\n\nInstall.", "docs/drafts/wip.md": "draft", "docs/big.txt": "x " * 5000,
        "src/code.txt": "not included", "notes.md": "top-level markdown",
    }, tenant=f"g-{unique}")
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE sources SET config = config || CAST(:c AS jsonb) WHERE id = :s"), {
            "s": corpus.source_id,
            "c": '{"include": ["docs/**", "*.md"], "exclude": ["**/drafts/"], "max_file_bytes": 1000}'})
    (corpus.root / "docs" / "big.txt").write_text("y " * 6000)  # changed: checked against the new limit
    stats = crawl(worker_engine, corpus)
    assert (stats.deleted, stats.excluded) == (2, 2)  # drafts/wip.md and src/code.txt leave the index
    with owner_engine.connect() as conn:
        files = dict(conn.execute(text("SELECT key, status_reason FROM files WHERE source_id = :s"),
                                  {"s": corpus.source_id}).all())
    assert set(files) == {"docs/guide.md", "docs/big.txt", "notes.md"}
    assert files["docs/big.txt"] == "file too large (12000 bytes > limit 1000)"


def test_extraction_is_killed_after_its_time_limit(owner_engine, worker_engine, tmp_path, unique):
    # millions of paragraphs: several seconds of work (13 s on a busy 2-core machine), stopped after 2 s
    files = {"ok.md": "# fine\n\nquick file", "slow.txt": "a\n\n" * 3_000_000}
    box = Sandbox(1, Limits(timeout_s=2))
    try:
        corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"t-{unique}", {}, tenant=f"t-{unique}")
        for name, body in files.items():
            (corpus.root / name).write_text(body)
        [source] = load_sources(db_of(worker_engine), source_id=corpus.source_id)
        stats = Indexer(db_of(worker_engine), Settings(), box=box).crawl(source)
    finally:
        box.close()
    with owner_engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT key, status || ': ' || coalesce(status_reason, '') FROM files "
                                      "WHERE source_id = :s"), {"s": corpus.source_id}).all())
    assert (stats.indexed, stats.failed) == (2, 1)
    assert rows == {"ok.md": "ok: ", "slow.txt": "failed: extraction timed out after 2 s"}


def test_the_sandbox_contains_hangs_memory_blowups_and_crashes(tmp_path):
    fifo = tmp_path / "hang.txt"
    os.mkfifo(fifo)  # opening it blocks forever: a deterministic hang
    big = tmp_path / "big.txt"
    big.write_bytes(b"word " * 8_000_000)  # 40 MB of text: more than the 64 MB cap once decoded
    good = tmp_path / "good.md"
    good.write_text("# Title\n\nSome text.")
    box = Sandbox(1, Limits(timeout_s=30, memory_mb=64))
    try:
        results = {task.ref: outcome for task, outcome in box.run([
            Task("good", "good.md", good.stat().st_size, path=str(good)),
            Task("big", "big.txt", big.stat().st_size, path=str(big)),
            Task("missing", "gone.txt", 10, path=str(tmp_path / "gone.txt")),
            Task("bytes", "inline.md", 9, data=b"# inline\n"),
            Task("again", "good.md", good.stat().st_size, path=str(good)),
        ])}
    finally:
        box.close()
    hang = Sandbox(1, Limits(timeout_s=1))
    try:
        [(_, results["hang"])] = hang.run([Task("hang", "hang.txt", 10, path=str(fifo))])
        [(_, results["after"])] = hang.run([Task("after", "good.md", good.stat().st_size, path=str(good))])
    finally:
        hang.close()
    assert {results[k].status for k in ("good", "again", "bytes", "after")} == {"ok"}
    assert "Some text." in results["good"].chunks[0][1]
    assert (results["hang"].status, results["hang"].reason) == ("failed", "extraction timed out after 1 s")
    assert (results["big"].status, results["big"].reason) == ("failed",
                                                              "extraction ran out of memory (limit 64 MB)")
    assert results["missing"].status == "failed" and "cannot read file" in results["missing"].reason


# -- real worker processes -----------------------------------------------------------------------------

def test_two_worker_processes_share_one_source(owner_url, owner_engine, worker_engine, tmp_path, unique):
    tenant = f"two-{unique}"
    root = tmp_path / tenant
    root.mkdir()
    for name, body in corpus_files(200).items():
        (root / name).write_text(body)
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name="shared")
    names = [f"w1-{unique}", f"w2-{unique}"]
    procs = [start_worker(owner_url, n, tenant, tmp_path, sleep=0.01, args=("--batch", "4")) for n in names]
    try:
        for name, proc in zip(names, procs, strict=True):
            wait_connected(owner_engine, name, proc)
        # as `kdbl-control crawl --queue --wait` would (owner role): queue, then wait for the workers
        [job_id] = queue.enqueue(db_of(owner_engine), [source.id])
        seen: list[int] = []
        statuses = queue.wait_for(db_of(owner_engine), [job_id], timeout_s=60, poll_s=0.05,
                                  on_progress=lambda st: seen.append(st[job_id].indexed))
        assert statuses[job_id].state == "done" and statuses[job_id].indexed == 200
    finally:
        codes = [stop_worker(p) for p in procs]
    assert codes == [0, 0]
    with owner_engine.connect() as conn:
        by_worker = dict(conn.execute(text(
            "SELECT split_part(leased_by, ':', 2)::int, count(*) FROM crawl_items WHERE job_id = :j "
            "AND state = 'done' AND attempts = 1 GROUP BY 1"), {"j": job_id}).all())
    assert set(by_worker) == {p.pid for p in procs}  # both took part
    assert sum(by_worker.values()) == 200  # every item done once, first time
    assert_indexed_exactly_once(owner_engine, source.id, 200)


def test_sigterm_finishes_the_current_file_and_hands_back_the_rest(owner_url, owner_engine, worker_engine,
                                                                   tmp_path, unique):
    tenant = f"term-{unique}"
    root = tmp_path / tenant
    root.mkdir()
    for name, body in corpus_files(60).items():
        (root / name).write_text(body)
    admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                              name="t")
    name = f"term-{unique}"
    proc = start_worker(owner_url, name, tenant, tmp_path, sleep=0.05, args=("--batch", "8"))
    try:
        wait_connected(owner_engine, name, proc)
        with db_of(worker_engine).connection() as conn:
            job_id = jobs.enqueue(conn, source.id)
        wait_until(lambda: item_states(owner_engine, job_id).get("done", 0) >= 5, 60, "5 files written")
    finally:
        code = stop_worker(proc, signal.SIGTERM)
    assert code == 0
    states = item_states(owner_engine, job_id)
    assert "running" not in states and states.get("queued", 0) > 0  # nothing left held, the rest handed back
    with owner_engine.connect() as conn:  # handed-back claims do not count as attempts
        assert conn.execute(text("SELECT max(attempts) FROM crawl_items "
                                 "WHERE job_id = :j AND state = 'queued'"), {"j": job_id}).scalar() == 0
    # another worker (here: an on-demand crawl of the source) finishes the run, then its own
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    stats = Indexer(db_of(worker_engine), Settings()).crawl(row)
    assert (stats.listed, stats.unchanged) == (60, 60)
    assert job_state(owner_engine, job_id) == "done"
    assert_indexed_exactly_once(owner_engine, source.id, 60)


def test_on_demand_crawls_of_one_source_at_once_do_not_duplicate_work(owner_engine, worker_engine, tmp_path,
                                                                     unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"cc-{unique}", {}, tenant=f"cc-{unique}")
    for name, body in corpus_files(80).items():
        (corpus.root / name).write_text(body)
    results, errors = [], []

    def run() -> None:
        try:
            results.append(crawl(worker_engine, corpus))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 2
    assert_indexed_exactly_once(owner_engine, corpus.source_id, 80)
