"""The worker's side of the crawl queue: claim → list / process → complete, with a heartbeat.

One loop serves both the long-running `kdbl-worker` (every tenant, scheduler on) and an on-demand
crawl (`Indexer.crawl`, `kdbl-control crawl`: one source, until its run is finished). The SQL lives in
`kdbl_worker.jobs`; what listing and processing mean lives in `kdbl_worker.pipeline`.

Timing (defaults): a claim holds a lease of `lease_s` = 60 s; the heartbeat thread renews this
worker's leases every `lease_s / 3` *while its work progresses* (`Activity`): a file finished, a stage
begun, an entry listed. A worker that made no progress for `stall_s` (the longest a healthy stage may
take: max(extraction timeout, per-file deadline) + `lease_s`) lets its leases run out, so a stalled
process loses its claims as a crashed one does (within `lease_s` of its death). The heartbeat also stamps
the items in hand (extracting or writing): an expired lease on such an item is a *break*, and a file
that broke two workers is given up as a poison file (kdbl_worker.jobs.sweep). Items are claimed
`batch` (16) at a time.

A full disk on the database server (SQLSTATE 53100 disk_full) is no file's fault and no retry fixes it:
the processing stops at the first file write that reports it (`DatabaseFull`), hands every file in hand
back to the queue without counting the attempt (each with the cause as its last error), and
- the long-running worker (`run`) pauses: it claims nothing for `full_pause_s` (10 s), then doubling up
  to `full_pause_max_s` (5 min), logging the cause at each pause, and resumes by itself once a write
  succeeds again;
- an on-demand crawl (`run_until_done`, `kdbl-control crawl`) stops with the error, naming the cause;
  its files stay queued, and the next crawl (or a worker) goes on where it stopped.
Before, each of those files was retried at once, up to five times, into the full disk (one crawl logged
"writing a file failed" 61 times, the cause only in PostgreSQL's log).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from psycopg import IntegrityError, OperationalError

from kdbl_core.content import bm25_lists
from kdbl_core.db.connect import Pool
from kdbl_core.errors import TemporaryError
from kdbl_worker import jobs, schedule

log = logging.getLogger(__name__)

DISK_FULL = "53100"  # SQLSTATE disk_full: "could not extend file ...: No space left on device"
LISTS_CHECK_S = 30.0  # how often a long crawl run builds the lists of what it wrote when due (bm25_lists.due)


class DatabaseFull(TemporaryError):
    """The database server's disk is full: no write can succeed until space is freed. `cause` names the
    SQLSTATE and the server's own message."""

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message, data={"sqlstate": DISK_FULL})
        self.cause = cause


def disk_full_cause(exc: BaseException | None) -> str | None:
    """'SQLSTATE 53100 disk_full: <the server's message> (<its hint>)' when `exc`, or an error it was
    raised from, is PostgreSQL's disk_full error; None otherwise."""
    seen = 0
    while exc is not None and seen < 5:
        if getattr(exc, "sqlstate", None) == DISK_FULL:
            diag = getattr(exc, "diag", None)
            message = (getattr(diag, "message_primary", None) or str(exc).splitlines()[0]).strip()
            hint = getattr(diag, "message_hint", None)
            return f"SQLSTATE {DISK_FULL} disk_full: {message}" + (f" ({hint})" if hint else "")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


class Activity:
    """What the heartbeat reads from the work: when it last progressed, and which items are in hand."""

    def __init__(self) -> None:
        self._last = time.monotonic()
        self._lock = threading.Lock()
        self._in_hand: dict[int, tuple[str, float]] = {}  # item id -> (key, since)
        self._overdue: set[int] = set()
        self.current = ""  # the key being listed or worked on, for progress lines

    def progressed(self, key: str | None = None) -> None:
        self._last = time.monotonic()
        if key is not None:
            self.current = key

    def idle_s(self) -> float:
        return time.monotonic() - self._last

    def begin(self, item_id: int, key: str) -> None:
        with self._lock:
            self._in_hand.setdefault(item_id, (key, time.monotonic()))
        self.progressed(key)

    def end(self, item_id: int) -> None:
        with self._lock:
            self._in_hand.pop(item_id, None)
            self._overdue.discard(item_id)
        self.progressed()

    def overdue(self, item_id: int) -> None:
        """The item's lease must not be renewed any more (its work passed its deadline)."""
        with self._lock:
            self._overdue.add(item_id)

    def in_hand(self) -> tuple[list[int], list[int]]:
        """(items being worked on, items overdue)."""
        with self._lock:
            return list(self._in_hand), list(self._overdue)

    def oldest_key(self) -> str:
        with self._lock:
            oldest = min(self._in_hand.values(), key=lambda v: v[1], default=None)
        return oldest[0] if oldest else self.current


class Work(Protocol):
    activity: Activity

    def list_job(self, job: jobs.JobClaim, stop: threading.Event) -> None: ...

    def process_items(self, items: list[jobs.ItemClaim], stop: threading.Event,
                      more: Callable[[], list[jobs.ItemClaim]] | None = None) -> None: ...

    def record_given_up(self, items: list[jobs.GivenUp]) -> None: ...


@dataclass(frozen=True, slots=True)
class QueueOptions:
    lease_s: float = 60.0
    stall_s: float | None = None  # None: renew while the process lives (no progress check)
    max_attempts: int = 5
    max_breaks: int = jobs.MAX_BREAKS
    batch: int = 16
    idle_poll_s: float = 1.0
    schedule_every_s: float = 15.0
    scheduler: bool = True
    tenants: tuple[str, ...] | None = None
    source_id: uuid.UUID | None = None
    full_pause_s: float = 10.0  # the first pause after the database reported a full disk (then doubling)
    full_pause_max_s: float = 300.0


def make_holder(kind: str = "worker") -> str:
    """A worker id unique across hosts, processes and restarts: host:pid:kind-random."""
    return f"{socket.gethostname()}:{os.getpid()}:{kind}-{secrets.token_hex(3)}"


class Heartbeat:
    """Every `lease_s / 3` seconds, on its own connection: renews the leases of `holder` while `activity`
    shows progress within `stall_s`, and stamps the items in hand as started."""

    def __init__(self, pool: Pool, holder: str, lease_s: float, activity: Activity | None = None,
                 stall_s: float | None = None) -> None:
        self.pool, self.holder, self.lease_s = pool, holder, lease_s
        self.activity, self.stall_s = activity or Activity(), stall_s
        self._stalled = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kdbl-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            idle = self.activity.idle_s()
            renew = self.stall_s is None or idle <= self.stall_s
            if renew == self._stalled:  # a change (stalled -> progressing or back): log it once
                self._stalled = not renew
                if self._stalled:
                    log.warning("no progress; leases left to expire",
                                extra={"holder": self.holder, "idle_s": round(idle, 1), "stall_s": self.stall_s,
                                       "current": self.activity.oldest_key()})
                else:
                    log.info("progress again; leases renewed", extra={"holder": self.holder})
            started, overdue = self.activity.in_hand()
            try:
                with self.pool.connection() as conn:
                    jobs.heartbeat(conn, self.holder, lease_s=self.lease_s, renew=renew, started=started,
                                   overdue=overdue)
            except Exception as exc:  # noqa: BLE001 - keep beating; the next beat may reach the database
                log.warning("heartbeat failed", extra={"holder": self.holder, "error": repr(exc)[:300]})


class QueueRunner:
    def __init__(self, pool: Pool, work: Work, *, holder: str | None = None,
                 options: QueueOptions | None = None) -> None:
        self.pool = pool
        self.work = work
        self.holder = holder or make_holder()
        self.options = options or QueueOptions()
        self.activity: Activity = getattr(work, "activity", None) or Activity()
        self._next_schedule = 0.0
        self._next_sweep = 0.0
        self._next_lists = time.monotonic() + LISTS_CHECK_S
        self._writing: set[uuid.UUID] = set()  # tenants with items claimed since the last lists check
        self._bad_schedules: set[tuple[uuid.UUID, str]] = set()

    # -- one round --------------------------------------------------------------------------------
    def step(self, stop: threading.Event, *, raise_for_job: int | None = None) -> bool:
        """Do one unit of work. Returns whether there was any (so the caller may idle when not)."""
        self._tick()
        items = self._claim_items()
        if items:
            self.work.process_items(items, stop, self._more)
            self._finalize()
            return True
        job = self._claim_job()
        if job is not None:
            self.activity.progressed()
            try:
                self.work.list_job(job, stop)
            except Exception as exc:  # one failed run must not stop the worker
                if raise_for_job == job.id:
                    raise
                log.warning("crawl failed", extra={"job_id": job.id, "source_id": str(job.source_id),
                                                   "error": getattr(exc, "message", None) or repr(exc)[:500]})
            self._finalize()  # a listing that queued nothing is finished right away
            return True
        if time.monotonic() >= self._next_sweep:  # idle: give up poison files whose lease ran out
            self._next_sweep = time.monotonic() + min(1.0, self.options.lease_s / 3)
            self.sweep()
        return bool(self._finalize())

    def _tick(self) -> None:
        if self.options.scheduler and time.monotonic() >= self._next_schedule:
            self._next_schedule = time.monotonic() + self.options.schedule_every_s
            self.schedule_due()
            self.housekeeping()

    def _claim_items(self) -> list[jobs.ItemClaim]:
        opts = self.options
        with self.pool.connection() as conn:
            items = jobs.claim_items(conn, self.holder, n=opts.batch, lease_s=opts.lease_s,
                                     max_attempts=opts.max_attempts, source_id=opts.source_id,
                                     tenants=opts.tenants, max_breaks=opts.max_breaks)
        if items:
            self.activity.progressed()
            self._writing.update(item.tenant_id for item in items)
        return items

    def _more(self) -> list[jobs.ItemClaim]:
        """The next batch, while the last one is still in progress (runs finished meanwhile are closed).
        Every LISTS_CHECK_S the lists of the tenants written meanwhile are built when due, so a long run's
        writers' generations (kdbl_core.content.store) stay a bounded delta, not one per file to the end."""
        self._finalize()
        self._tick()
        if time.monotonic() >= self._next_lists:
            self._next_lists = time.monotonic() + LISTS_CHECK_S
            writing, self._writing = self._writing, set()
            for tenant_id in sorted(writing):
                try:
                    self.build_lists(tenant_id)
                except Exception as exc:  # noqa: BLE001 - the crawl goes on; the run's end tries again
                    log.warning("packing the keyword lists failed", extra={"tenant_id": str(tenant_id),
                                                                          "error": repr(exc)[:300]})
        return self._claim_items()

    def _claim_job(self) -> jobs.JobClaim | None:
        opts = self.options
        try:
            with self.pool.connection() as conn:
                return jobs.claim_job(conn, self.holder, lease_s=opts.lease_s, max_attempts=opts.max_attempts,
                                      source_id=opts.source_id, tenants=opts.tenants)
        except IntegrityError:  # a run of that source became active meanwhile; try again next round
            return None

    def _finalize(self) -> list[int]:
        with self.pool.connection() as conn:
            done = jobs.finalize(conn, self.options.source_id)
            tenants = jobs.tenants_of(conn, done) if done else []
        for job_id in done:
            log.info("crawl run finished", extra={"job_id": job_id})
        for tenant_id in tenants:
            self.build_lists(tenant_id)
        return done

    def build_lists(self, tenant_id: uuid.UUID, *, force: bool = False) -> dict | None:
        """After a crawl run: pack what the tenant wrote since the last build as a new generation, or all
        of it again, when enough changed (kdbl_core.content.bm25_lists.due; searches are exact either way,
        building makes them read less)."""
        with self.pool.connection() as conn:
            try:
                kind = "full" if force else bm25_lists.due(conn, tenant_id)
                conn.commit()
                if kind is None:
                    return None
                log.info("building the packed keyword lists", extra={"tenant_id": str(tenant_id), "kind": kind})
                built = bm25_lists.build(conn, tenant_id, kind)
            finally:
                conn.rollback()  # nothing open after a build; after a failure, whatever was
                conn.autocommit = False
        log.info("packed keyword lists built", extra={"tenant_id": str(tenant_id), **built})
        return built

    # -- scheduling and housekeeping ----------------------------------------------------------------
    def schedule_due(self, now: datetime | None = None) -> list[int]:
        """Queue a run for every enabled source whose latest schedule slot no run serves yet."""
        with self.pool.connection() as conn:
            db_now, sources = jobs.schedule_input(conn, self.options.tenants)
            slots = []
            for source_id, expr in sources:
                try:
                    slot = schedule.latest_slot(expr, now or db_now)
                except schedule.ScheduleError as exc:
                    if (source_id, expr) not in self._bad_schedules:
                        self._bad_schedules.add((source_id, expr))
                        log.warning("bad schedule; source not scheduled",
                                    extra={"source_id": str(source_id), "error": str(exc)})
                    continue
                if slot is not None:
                    slots.append((source_id, slot))
            queued = jobs.enqueue_due(conn, slots)
        if queued:
            log.info("scheduled crawl runs queued", extra={"jobs": queued})
        return queued

    def sweep(self) -> list[jobs.GivenUp]:
        """Give up on items that broke workers (or expired too often); the work records their files."""
        with self.pool.connection() as conn:
            given_up = jobs.sweep(conn, max_attempts=self.options.max_attempts,
                                  max_breaks=self.options.max_breaks)
        if given_up:
            log.warning("files given up", extra={"items": [(g.file.key, g.reason) for g in given_up[:20]]})
            record = getattr(self.work, "record_given_up", None)
            if record is not None:
                record(given_up)
        return given_up

    def housekeeping(self) -> None:
        self.sweep()
        with self.pool.connection() as conn:
            jobs.prune(conn)

    # -- loops ---------------------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, exit_when_idle: bool = False) -> None:
        """Serve the queue until `stop` is set (or, with exit_when_idle, until there is nothing to do)."""
        pause = 0.0
        with self._heartbeat():
            while not stop.is_set():
                try:
                    busy = self.step(stop)
                    pause = 0.0 if busy else pause
                except DatabaseFull as exc:  # no retry into a full disk: pause, longer each time
                    pause = min(max(pause * 2, self.options.full_pause_s), self.options.full_pause_max_s)
                    log.error("database disk full; crawling paused", extra={
                        "holder": self.holder, "cause": exc.cause, "retry_in_s": pause})
                    stop.wait(pause)
                    continue
                except OperationalError as exc:  # database unreachable: wait and retry
                    log.warning("queue round failed", extra={"error": repr(exc)[:300]})
                    busy = False
                except Exception:  # a bug must not stop every tenant's crawling; claims expire and retry
                    log.exception("queue round failed")
                    busy = False
                if not busy:
                    if exit_when_idle and not self._open_work():
                        return
                    stop.wait(self.options.idle_poll_s)

    def run_until_done(self, job_id: int, stop: threading.Event | None = None) -> jobs.JobStatus:
        """Work (on this runner's source only) until run `job_id` is finished; returns its status.

        Raises the listing error when this runner listed the run and the listing failed, a
        TemporaryError when another worker's listing of it failed, TenantDisabled when the run's
        tenant is (or becomes) disabled, and DatabaseFull when a file write found the database's disk
        full (the files left stay queued). Returns the status as it is when `stop` is set.
        """
        stop = stop or threading.Event()
        idle = 0.02
        self.housekeeping()  # on-demand crawls (kdbl-control crawl, up) prune old runs too
        with self._heartbeat():
            while True:
                busy = False if stop.is_set() else self.step(stop, raise_for_job=job_id)
                with self.pool.connection() as conn:
                    status = jobs.job_status(conn, [job_id]).get(job_id)
                if status is None:
                    raise TemporaryError(f"crawl run {job_id} disappeared (its source was deleted?)")
                if status.state == "failed":
                    raise TemporaryError(f"crawl failed: {status.last_error}")
                if status.state == "done" or stop.is_set():
                    return status
                if not status.tenant_enabled:
                    raise jobs.TenantDisabled("the tenant of this source was disabled: its crawl is paused "
                                              "and resumes when the tenant is enabled again")
                if busy:
                    idle = 0.02
                else:  # others hold the remaining leases: poll, backing off to 0.5 s
                    stop.wait(idle)
                    idle = min(idle * 2, 0.5)

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(self.pool, self.holder, self.options.lease_s, self.activity, self.options.stall_s)

    def _open_work(self) -> bool:
        with self.pool.connection() as conn:
            return jobs.has_open_runs(conn, self.options.tenants)


# ---------------------------------------------------------------------------------------------
# For kdbl-control: enqueue and wait for the workers
# ---------------------------------------------------------------------------------------------
def enqueue(pool: Pool, source_ids: Sequence[uuid.UUID]) -> list[int]:
    """Queue an on-demand run per source (joining one already queued); returns the job ids."""
    with pool.connection() as conn:
        return [jobs.enqueue(conn, sid) for sid in source_ids]


def wait_for(pool: Pool, job_ids: Sequence[int], *, timeout_s: float | None = None, poll_s: float = 1.0,
             on_progress: Callable[[dict[int, jobs.JobStatus]], None] | None = None,
             stop: threading.Event | None = None) -> dict[int, jobs.JobStatus]:
    """Poll until every run is done or failed (or the timeout passes, or `stop` is set); returns the
    last statuses."""
    stop = stop or threading.Event()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        with pool.connection() as conn:
            statuses = jobs.job_status(conn, job_ids)
        if on_progress is not None:
            on_progress(statuses)
        if all(s.state in ("done", "failed") for s in statuses.values()):
            return statuses
        if deadline is not None and time.monotonic() >= deadline:
            still = sorted(i for i, s in statuses.items() if s.state not in ("done", "failed"))
            raise TimeoutError(f"crawl runs still open after {timeout_s:g} s: {still}")
        if stop.wait(poll_s):
            return statuses
