"""Crawl sources through the job queue: list a source into items, index items one transaction each.

- Listing (`Indexer.list_job`, one worker per run): the connector lists the source (stat only); keys
  outside the source's include/exclude globs are ignored; files whose size+mtime (or etag) match the
  stored row are skipped; the others become queue items. When the listing is complete, keys indexed
  before but not listed now are deleted, in the transaction that ends the listing. A root that cannot
  be listed fails the run *without* deleting anything (an unmounted share must not wipe the index).
  Audio/video files are queued last, each with the subtitle file the listing pairs it with
  (`kdbl_worker.sidecars`); their bytes are fetched only when a transcriber will read them.
- Processing (`Indexer.process_items`, any number of workers): each item is opened, extracted and
  chunked in the extraction sandbox (time and memory limits), then written in ONE transaction that
  also completes the item, fenced by its lease: a crash at any moment leaves the old file or the new
  one, and a file is never written twice for one run.
- `Indexer.crawl(source, stop=...)` queues an on-demand run and works on it in this process until it is
  finished or `stop` is set (workers running elsewhere may share the work); it returns the run's
  statistics (`stopped` when interrupted: the run stays queued for the next crawl or worker).
- No file can hold a crawl: each file has a deadline (kdbl_worker.deadlines) covering its extraction
  (decompression included), its token counting and its write, past which it is recorded failed with the
  reason; a stop aborts writes in progress after a short grace (rolled back, handed back); a file that
  broke two workers is recorded failed as a poison file (`record_given_up`).
- A full disk on the database server (SQLSTATE 53100) stops the processing at the first write that
  reports it: the files in hand go back to the queue unfailed, with the cause (kdbl_worker.queue says
  what the worker and an on-demand crawl then do).
- A member key a listed file already has (a real folder `x.zip!` beside `x.zip`) stays the listed
  file's; the container says which member it left out (kdbl_worker.member_keys).
- What a crawl reports counts as its run does (`jobs.job_status`): done items are `indexed`, failed
  items and files recorded failed are `failed`, whether the run finished or was stopped.
- Tenant quotas (tenants.settings.quotas, kdbl_core.access.policy): a listing queues no new file past
  max_files / max_bytes and says so in the run's problems; a source past max_sources is not listed.
  Files already indexed stay (quotas are checked at listing; concurrent listings of one tenant may
  overshoot by what they list at the same time).

Problems with single files become that file's status (ok / partial / failed / skipped with a reason).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kdbl_core.access import share_acl
from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import store
from kdbl_core.content.records import Chunk, FileMeta
from kdbl_core.db.connect import Pool
from kdbl_core.settings import Settings
from kdbl_core.sources import relabel
from kdbl_core.sources.globs import Selection
from kdbl_core.sources.labels import NO_LABELS, Labeler, own_labels
from kdbl_worker import deadlines, extract, jobs, member_keys, sandbox, token_counts
from kdbl_worker.connectors import Connector, connector_for
from kdbl_worker.connectors.fs import FsConnector
from kdbl_worker.extract import containers, media, ocr
from kdbl_worker.quotas import Quota, QuotaExceeded  # noqa: F401 - QuotaExceeded: callers import it here
from kdbl_worker.queue import (
    DISK_FULL,
    Activity,
    DatabaseFull,
    QueueOptions,
    QueueRunner,
    disk_full_cause,
    make_holder,
)
from kdbl_worker.share_permissions import SharePermissions
from kdbl_worker.sidecars import Sidecars, is_subtitle

log = logging.getLogger(__name__)

Progress = Callable[["CrawlStats", str], None]

ITEM_BATCH = 500  # listed items queued per statement
INLINE_BYTES = 32 * 1024  # remote files up to this size travel to the sandbox in its pipe; larger are spooled
SIDECAR_MAX_BYTES = 16 * 1024 * 1024  # a subtitle sidecar larger than this is not used
DEFAULT_FILE_DEADLINE_S = 300.0
RECORD_TIMEOUT_MS = 10_000  # recording a file as failed must not hang either
# A btree entry holds at most ~2,700 bytes (files' (tenant, source, key) index): a longer member key (three
# levels of 1 KiB paths) would abort its parent's whole transaction, so such a member is left out
MAX_MEMBER_KEY_BYTES = 2500


@dataclass(slots=True)
class CrawlStats:
    source_id: uuid.UUID
    listed: int = 0
    indexed: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[tuple[str, str]] = field(default_factory=list)
    excluded: int = 0
    stopped: bool = False  # the crawl was told to stop before its run finished


class _Written(NamedTuple):
    """What one file's write counts for its run: the run's `indexed` (items done), chunks and failed."""

    indexed: int
    chunks: int
    failed: int


def _cause(error: BaseException) -> str:
    """An error as its log line and its item's last error say it: the SQLSTATE and the server's message."""
    state, text = getattr(error, "sqlstate", None), str(error).strip()
    if state:
        return f"SQLSTATE {state}: {text.splitlines()[0] if text else type(error).__name__}"
    return repr(error)


@dataclass(frozen=True, slots=True)
class SourceRow:
    id: uuid.UUID
    tenant_id: uuid.UUID
    protocol: str
    config: dict
    enabled: bool
    acl_mode: str = "tenant"
    permission_map: dict = field(default_factory=dict)

    @property
    def from_share(self) -> bool:
        """Its files are read by whom the share's own permissions allow (migration 0023)."""
        return self.acl_mode == "source"


def load_sources(pool: Pool, *, tenant: str | None = None,
                 source_id: uuid.UUID | None = None) -> list[SourceRow]:
    sql = ("SELECT s.id, s.tenant_id, s.protocol, s.config, s.enabled, s.acl_mode, s.permission_map FROM sources s "
           "JOIN tenants t ON t.id = s.tenant_id WHERE true")
    params: dict = {}
    if tenant is not None:
        sql += " AND t.name = %(tenant)s"
        params["tenant"] = tenant
    if source_id is not None:
        sql += " AND s.id = %(sid)s"
        params["sid"] = source_id
    with pool.connection() as conn:
        rows = conn.execute(sql + " ORDER BY t.name, s.name", params).fetchall()
    return [SourceRow(r.id, r.tenant_id, r.protocol, r.config, r.enabled, r.acl_mode, r.permission_map)
            for r in rows]


def _clean(value: str) -> str:
    return sandbox.clean(value)


def _unchanged(state: store.FileState | None, remote: FileMeta) -> bool:
    if state is None or state.status == "pending" or state.stale:  # stale: an older analysis (0019)
        return False
    if remote.etag is not None and state.etag is not None:
        return remote.etag == state.etag and remote.size == state.size
    return remote.size == state.size and remote.mtime == state.mtime


def _waits_for_transcriber(state: store.FileState | None) -> bool:
    """Skipped only because no transcriber was configured: worth one more try once one is."""
    return state is not None and state.status == "skipped" and state.status_reason == media.NO_TRANSCRIBER


def _waits_for_ocr(state: store.FileState | None) -> bool:
    """Left unread only because OCR was off or not installed: worth one more try once it is on."""
    reason = (state.status_reason or "") if state is not None else ""
    return ocr.OFF in reason or ocr.NOT_INSTALLED in reason


def ocr_enabled(config: dict) -> bool:
    """A source's `ocr` config key: images and scanned PDF pages are OCRed unless it is false."""
    return config.get("ocr", True) is not False


def limits_from(settings: Settings) -> sandbox.Limits:
    """Extraction limits. `extract_timeout_s` / `extract_memory_mb` are read when Settings has them; the
    timeout is at most the per-file deadline (`file_deadline_s`)."""
    deadline = float(getattr(settings, "file_deadline_s", DEFAULT_FILE_DEADLINE_S))
    return sandbox.Limits(
        # the file's deadline covers its extraction too (kdbl_worker.deadlines)
        timeout_s=min(float(getattr(settings, "extract_timeout_s", sandbox.DEFAULT_TIMEOUT_S)), deadline),
        memory_mb=getattr(settings, "extract_memory_mb", sandbox.DEFAULT_MEMORY_MB),
        chunk_target=settings.chunk_target_chars, chunk_max=settings.chunk_max_chars,
        transcriber_model=settings.transcriber_model, ocr_max_pages=settings.ocr_max_pages,
        container_max_depth=settings.container_max_depth,
        container_max_members=settings.container_max_members,
        container_max_member_bytes=settings.container_max_member_bytes,
        container_max_expanded_bytes=settings.container_max_expanded_bytes,
    )


@dataclass(slots=True)
class _SourceContext:
    row: SourceRow
    connector: Connector
    max_bytes: int
    labeler: Labeler  # the source's `labels` / `label_globs` (kdbl_core.sources.labels)
    object_tags: dict[int, list[str]] = field(default_factory=dict)  # item id -> its S3 tags (`object_tags`)


class Indexer:
    """Lists sources into queue items and turns items into rows, one transaction per file."""

    def __init__(self, pool: Pool, settings: Settings, *, box: sandbox.Sandbox | None = None,
                 durable_commits: bool | None = None, lease_s: float | None = None,
                 writers: int | None = None, stall_s: float | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.count_tokens = token_counts.counter(settings)  # each chunk's text_tokens
        self.box = box or sandbox.shared(getattr(settings, "extract_processes", None), limits_from(settings))
        # See store.FileWriter.write: per-file commits need not wait for the WAL flush.
        self.durable = bool(getattr(settings, "durable_file_commits", False)) if durable_commits is None \
            else durable_commits
        self.lease_s = float(lease_s or getattr(settings, "job_lease_s", 60.0))
        # Concurrent file transactions (each its own connection): Postgres tokenises and indexes one file
        # on each core while this process feeds the sandbox.
        self.writers = max(1, int(writers or getattr(settings, "write_connections", 2)))
        self.max_attempts = 5
        self.file_deadline_s = float(getattr(settings, "file_deadline_s", DEFAULT_FILE_DEADLINE_S))
        # the longest a healthy worker goes without progress: one stage at its limit, plus a lease
        self.stall_s = float(stall_s) if stall_s is not None else (
            max(self.box.limits.timeout_s, self.file_deadline_s) + deadlines.DEFAULT_GRACE_S + self.lease_s)
        self.activity = Activity()
        self.watchdog = deadlines.Watchdog(pool, self.file_deadline_s, on_deadline=self.activity.overdue)
        self._write_pool: Pool | None = None
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None  # process_items' stop, for files still waiting to be written
        self._writer_pool: ThreadPoolExecutor | None = None
        self._thread_writer = threading.local()
        self._file_writers: list[store.FileWriter] = []
        self._progress: Progress | None = None
        self._local: CrawlStats | None = None
        self._full: DatabaseFull | None = None  # a file write found the database's disk full (process_items)

    # -- on-demand crawl ------------------------------------------------------------------------------
    def crawl(self, source: SourceRow, progress: Progress | None = None, *,
              stop: threading.Event | None = None) -> CrawlStats:
        """Queue a run of `source` and work on it here until it is finished (or `stop` is set: within
        about `deadlines.DEFAULT_STOP_GRACE_S`, even mid-commit); its statistics.

        TenantDisabled when the source's tenant is disabled."""
        started = time.monotonic()
        with self.pool.connection() as conn:
            job_id = jobs.enqueue(conn, source.id)
        runner = QueueRunner(self.pool, self, holder=make_holder("crawl"), options=QueueOptions(
            lease_s=self.lease_s, stall_s=self.stall_s, scheduler=False, source_id=source.id))
        self._progress, self._local = progress, CrawlStats(source_id=source.id)
        try:
            status = runner.run_until_done(job_id, stop)
        except DatabaseFull as exc:  # the files left stay queued: the next crawl goes on where this one stopped
            with self.pool.connection() as conn:
                status = jobs.job_status(conn, [job_id])[job_id]
            log.error("crawl stopped: the database's disk is full", extra={
                "source_id": str(source.id), "job_id": job_id, "indexed": status.indexed,
                "failed": status.failed, "pending": status.pending, "sqlstate": DISK_FULL, "cause": exc.cause})
            raise DatabaseFull(
                f"crawl stopped: the database's disk is full ({exc.cause}); {status.indexed} files indexed, "
                f"{status.failed} failed, {status.pending} left queued in run {job_id}: free space on the "
                "database server and crawl again (it goes on where it stopped)", cause=exc.cause) from exc
        finally:
            self._progress = self._local = None
            self.close()
        stats = CrawlStats(
            source_id=source.id, listed=status.listed, indexed=status.indexed, unchanged=status.unchanged,
            deleted=status.deleted, failed=status.failed, chunks=status.chunks, bytes=status.bytes,
            seconds=time.monotonic() - started, problems=status.problems, excluded=status.excluded,
            stopped=status.state != "done")
        log.info("crawl stopped" if stats.stopped else "crawl finished", extra={
            "source_id": str(source.id), "job_id": job_id, "listed": stats.listed, "indexed": stats.indexed,
            "unchanged": stats.unchanged, "deleted": stats.deleted, "failed": stats.failed,
            "seconds": round(stats.seconds, 3),
        })
        return stats

    @property
    def local_stats(self) -> CrawlStats | None:
        """The running on-demand crawl's statistics so far (None between crawls)."""
        return self._local

    def _report(self, key: str, **add: int) -> None:
        if key:
            self.activity.progressed(key)
        if self._local is None:
            return
        for name, value in add.items():
            setattr(self._local, name, getattr(self._local, name) + value)
        if self._progress is not None:
            self._progress(self._local, key)

    # -- listing ----------------------------------------------------------------------------------------
    def list_job(self, job: jobs.JobClaim, stop: threading.Event) -> None:
        [source] = load_sources(self.pool, source_id=job.source_id) or [None]
        connector = None
        try:
            if source is None:
                raise LookupError(f"source {job.source_id} no longer exists")
            if not source.enabled and job.reason == "schedule":
                raise LookupError("source is disabled")
            connector = connector_for(source.protocol, source.config)
            selection = Selection.from_config(source.config)
            ocr_on = ocr_enabled(source.config)
            with tenant_transaction(self.pool, job.tenant_id) as conn:
                known = store.load_file_states(conn, job.source_id)
                quota = Quota.load(conn, job.tenant_id, job.source_id)
            quota.check_sources()
            listed: set[str] = set()
            excluded = unchanged = 0
            batch: list[jobs.ItemRow] = []
            sidecars = Sidecars()

            def add(remote: FileMeta, fresh: bool, sidecar_key: str | None = None) -> None:
                nonlocal unchanged
                if fresh:
                    unchanged += 1
                    self._report(remote.key, listed=1, unchanged=1)
                    return
                if not quota.admit(remote, known.get(remote.key)):
                    self._report(remote.key, listed=1)
                    return
                batch.append(jobs.ItemRow(remote, had_file=remote.key in known, sidecar_key=sidecar_key))
                self._report(remote.key, listed=1)
                if len(batch) >= ITEM_BATCH:
                    self._queue(job, batch)

            share = SharePermissions(self.pool, source, known) if source.from_share else None
            lists_access = share is not None and source.protocol in share_acl.FROM_SOURCE_PROTOCOLS
            for remote in (connector.walk(**share.walk_options()) if lists_access else connector.walk()):
                self.activity.progressed(remote.key)
                if stop.is_set():
                    with self.pool.connection() as conn:
                        jobs.release_listing(conn, job.id, job.lease)
                    return
                if not selection(remote.key):
                    excluded += 1
                    continue
                if share is not None:
                    remote = share.file(remote)
                listed.add(remote.key)
                if extract.is_media(remote.key):
                    sidecars.media.append(remote)  # paired with its subtitles once the listing is complete
                    continue
                state = known.get(remote.key)
                fresh = _unchanged(state, remote) and not (ocr_on and _waits_for_ocr(state))
                if is_subtitle(remote.key):
                    sidecars.add_subtitle(remote.key, changed=not fresh)
                add(remote, fresh)
            gone = sorted(set(known) - listed)
            sidecars.deleted(gone)
            transcriber = self.box.limits.transcriber_model is not None
            for remote in sidecars.media:
                state = known.get(remote.key)
                fresh = (_unchanged(state, remote) and not sidecars.touched(remote.key)
                         and not (transcriber and _waits_for_transcriber(state)))
                add(remote, fresh, sidecars.sidecar_for(remote.key))
            self._queue(job, batch)
            with tenant_transaction(self.pool, job.tenant_id) as conn:
                jobs.lock_listing(conn, job.id, job.lease)
                deleted = store.delete_files(conn, job.tenant_id, job.source_id, gone) if gone else 0
                if share is not None:  # files the share now allows others to read, re-read or not
                    share.apply(conn, job.id, known)
                jobs.finish_listing(conn, job.id, job.lease, listed=len(listed), excluded=excluded,
                                    unchanged=unchanged, deleted=deleted,
                                    problems=quota.problems() + list(connector.problems.items))
            self._report("", deleted=deleted)
        except store.FenceLost:
            log.warning("listing lease lost; another worker lists again", extra={"job_id": job.id})
        except Exception as exc:
            message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            problems = list(connector.problems.items) if connector is not None else []
            with self.pool.connection() as conn:
                jobs.fail_listing(conn, job.id, job.lease, message, problems)
            raise

    def _queue(self, job: jobs.JobClaim, batch: list[jobs.ItemRow]) -> None:
        if batch:
            with self.pool.connection() as conn:
                jobs.add_items(conn, job.id, job.lease, batch)
            batch.clear()

    # -- processing -------------------------------------------------------------------------------------
    def process_items(self, items: list[jobs.ItemClaim], stop: threading.Event,
                      more: Callable[[], list[jobs.ItemClaim]] | None = None) -> None:
        """Index claimed items, and then those `more()` claims, until it claims nothing (or `stop`).

        The next batch is claimed when the sandbox is ready for its first file, while the previous
        batch is still being extracted and written: no pause between batches, and a busy worker
        always holds leases (so its death is always visible as leases to take over).
        """
        items = list(items)
        self._stop, self._full = stop, None
        self.watchdog.stop_on(stop)
        contexts: dict[uuid.UUID, _SourceContext | None] = {}
        # claims handed on (by identity: an item handed back meanwhile, say for a full disk, may be claimed
        # again by this very call, with the same id and attempt)
        finished: set[int] = set()
        direct: list[tuple[jobs.ItemClaim, sandbox.Outcome]] = []
        errors: list[tuple[jobs.ItemClaim, str]] = []
        spooled: dict[int, str] = {}
        relabelled: dict[uuid.UUID, uuid.UUID] = {}  # sources whose label config changed meanwhile -> tenant

        def claimed() -> Iterator[jobs.ItemClaim]:
            batch = list(items)
            while batch:
                yield from batch
                if stop.is_set() or more is None or self._full is not None:
                    return
                batch = more()
                self._follow_label_changes(contexts, relabelled)
                items.extend(batch)

        def tasks() -> Iterator[sandbox.Task]:
            for item in claimed():
                if stop.is_set() or self._full is not None:
                    return
                try:
                    task = self._task(item, contexts, spooled)
                except Exception as exc:  # noqa: BLE001 - e.g. a throttled remote: retried later
                    errors.append((item, getattr(exc, "message", None) or repr(exc)[:500]))
                    self.activity.progressed(item.file.key)
                    continue
                if isinstance(task, sandbox.Outcome):
                    direct.append((item, task))
                else:
                    task.ocr = ocr_enabled(contexts[item.source_id].row.config)
                    yield task

        def results() -> Iterator[tuple[jobs.ItemClaim, sandbox.Outcome]]:
            started = lambda task: self.activity.begin(task.ref.id, task.ref.file.key)  # noqa: E731
            with closing(self.box.run(tasks(), stop=stop, on_start=started)) as outcomes:
                for task, outcome in outcomes:
                    while direct:
                        yield direct.pop()
                    yield task.ref, outcome
            while direct:
                yield direct.pop()

        inflight: dict[Future, jobs.ItemClaim] = {}

        def collect(block: bool) -> None:
            if not inflight:
                return
            done, _ = wait(list(inflight), timeout=None if block else 0, return_when=FIRST_COMPLETED)
            for future in done:
                item = inflight.pop(future)
                path = spooled.pop(item.id, None)
                if path:
                    os.unlink(path)
                try:
                    written = future.result()
                except Exception as exc:  # noqa: BLE001 - unreleased: its lease expires, it is retried
                    log.error("file write crashed", extra={"key": item.file.key, "error": repr(exc)[:500]})
                    continue
                finally:
                    self.activity.end(item.id)
                if written is not None:  # counted as the run's statistics count it (jobs.finalize)
                    self._report(item.file.key, indexed=written.indexed, chunks=written.chunks,
                                 bytes=item.file.size if written.indexed else 0, failed=written.failed)

        gen = results()
        try:
            for item, outcome in gen:
                while len(inflight) >= 2 * self.writers:
                    collect(block=True)
                ctx = contexts.get(item.source_id)
                labeler = ctx.labeler if ctx else NO_LABELS
                if ctx is not None and item.id in ctx.object_tags:
                    outcome.tags[:0] = ctx.object_tags.pop(item.id)
                inflight[self._pool().submit(self._finish, item, outcome, labeler)] = item
                finished.add(id(item))
                collect(block=False)
                if stop.is_set() or self._full is not None:
                    break
        finally:
            gen.close()
            while inflight:  # finished, or aborted by the watchdog 2 s after a stop (rolled back)
                collect(block=True)
            self._follow_label_changes(contexts, relabelled)
            self._relabel(relabelled)
            for path in spooled.values():
                os.unlink(path)
            for item in items:
                if id(item) not in finished:
                    self.activity.end(item.id)
            for item, error in errors:
                finished.add(id(item))
                with self.pool.connection() as conn:
                    jobs.release_item(conn, item.id, item.lease, error=error,
                                      give_up=item.lease.attempt >= self.max_attempts)
            left = [i for i in items if id(i) not in finished]
            if left:
                with self.pool.connection() as conn:
                    jobs.release_unstarted(conn, left)
        if self._full is not None:
            raise self._full

    def _follow_label_changes(self, contexts: dict[uuid.UUID, _SourceContext | None],
                              relabelled: dict[uuid.UUID, uuid.UUID]) -> None:
        """A source's `labels` / `label_globs` changed while its files were being written: its writer
        relabelled the files written until then (kdbl_core.sources.relabel), files written here with
        the old labeler since would keep the old labels. The next files take the new labels, and the
        source is relabelled again once the files in hand are written (`_relabel`). One query per
        claimed batch."""
        live = {source_id: ctx for source_id, ctx in contexts.items() if ctx is not None}
        if not live:
            return
        try:
            with self.pool.connection() as conn:
                rows = conn.execute("SELECT id, config FROM sources WHERE id = ANY(%(ids)s)",
                                    {"ids": list(live)}).fetchall()
            for row in rows:
                ctx = live[row.id]
                if relabel.label_config_changed(ctx.row.config, row.config):
                    ctx.labeler = Labeler.from_config(row.config)
                    ctx.row = replace(ctx.row, config=row.config)
                    relabelled[row.id] = ctx.row.tenant_id
        except Exception as exc:  # noqa: BLE001 - the files keep the labels they were written with
            log.warning("label config check failed", extra={"error": repr(exc)[:300]})

    def _relabel(self, relabelled: dict[uuid.UUID, uuid.UUID]) -> None:
        for source_id, tenant_id in relabelled.items():
            try:
                with tenant_transaction(self.pool, tenant_id) as conn:
                    relabel.relabel(conn, source_id)
            except Exception as exc:  # noqa: BLE001 - they follow at their next re-index or label change
                log.warning("relabel after a label change failed",
                            extra={"source_id": str(source_id), "error": repr(exc)[:300]})
        relabelled.clear()

    def _pool(self) -> ThreadPoolExecutor:
        if self._writer_pool is None:
            self._writer_pool = ThreadPoolExecutor(self.writers, thread_name_prefix="kdbl-write")
        return self._writer_pool

    def _file_writer(self) -> store.FileWriter:
        """This writer thread's own connection (with the per-file deadline: kdbl_worker.deadlines)."""
        writer = getattr(self._thread_writer, "writer", None)
        if writer is None:
            with self._lock:  # writer threads start together
                if self._write_pool is None:
                    self._write_pool = deadlines.write_pool(self.pool, self.file_deadline_s, self.writers)
            writer = self._thread_writer.writer = store.FileWriter(self._write_pool,
                                                                     on_checkout=self.watchdog.track)
            self._file_writers.append(writer)
        return writer

    def close(self) -> None:
        """Stop the writer threads and return their connections (the shared sandbox closes at exit)."""
        if self._writer_pool is not None:
            self._writer_pool.shutdown(wait=True)
            self._writer_pool = None
        for writer in self._file_writers:
            writer.close()
        self._file_writers.clear()
        self._thread_writer = threading.local()
        self.watchdog.close()
        if self._write_pool is not None:
            self._write_pool.close()
            self._write_pool = None

    def _context(self, item: jobs.ItemClaim, contexts: dict) -> _SourceContext | None:
        if item.source_id not in contexts:
            rows = load_sources(self.pool, source_id=item.source_id)
            if not rows:
                contexts[item.source_id] = None
            else:
                row = rows[0]
                limit = row.config.get("max_file_bytes")
                max_bytes = limit if isinstance(limit, int) and limit > 0 else self.settings.max_file_bytes
                connector = connector_for(row.protocol, row.config)
                contexts[item.source_id] = _SourceContext(row, connector, max_bytes,
                                                          Labeler.from_config(row.config))
        return contexts[item.source_id]

    def _task(self, item: jobs.ItemClaim, contexts: dict,
              spooled: dict[int, str]) -> sandbox.Task | sandbox.Outcome:
        ctx = self._context(item, contexts)
        content_type, _ = extract.detect(item.file.key)
        if ctx is None:
            raise LookupError(f"source {item.source_id} no longer exists")
        if extract.is_media(item.file.key):
            sidecar = self._sidecar(ctx, item)
            if not media.reads_stream(has_sidecar=sidecar is not None,
                                      transcriber_model=self.box.limits.transcriber_model):
                return sandbox.Task(item, item.file.key, item.file.size, data=b"", sidecar=sidecar)  # bytes not needed
        if item.file.size > ctx.max_bytes:
            return sandbox.Outcome("skipped", f"file too large ({item.file.size} bytes > limit {ctx.max_bytes})",
                                   None, content_type, 0, [])
        if isinstance(ctx.connector, FsConnector):
            try:
                # the child opens it beneath the root itself: no window between the check and the read
                return sandbox.Task(item, item.file.key, item.file.size, opener=ctx.connector.opener(item.file.key))
            except OSError as exc:
                return sandbox.Outcome.failed(f"cannot read file: {exc.strerror or exc}", content_type)
        try:
            tags = getattr(ctx.connector, "object_tags", None)  # S3 with config object_tags: true
            if tags is not None and (labels := tags(item.file.key)):
                ctx.object_tags[item.id] = labels
            with ctx.connector.open(item.file.key) as stream:
                if item.file.size <= INLINE_BYTES:
                    return sandbox.Task(item, item.file.key, item.file.size, data=stream.read(INLINE_BYTES + 1))
                fd, path = tempfile.mkstemp(prefix="kdbl-spool-")
                spooled[item.id] = path
                with os.fdopen(fd, "wb") as out:
                    shutil.copyfileobj(stream, out, 1024 * 1024)
                return sandbox.Task(item, item.file.key, item.file.size, path=path)
        except OSError as exc:
            return sandbox.Outcome.failed(f"cannot read file: {exc.strerror or exc}", content_type)

    def _sidecar(self, ctx: _SourceContext, item: jobs.ItemClaim) -> extract.Sidecar | None:
        """The subtitle file the listing paired with a media item (None: there is none, or it is unusable)."""
        if item.sidecar_key is None:
            return None
        try:
            with ctx.connector.open(item.sidecar_key) as stream:
                data = stream.read(SIDECAR_MAX_BYTES + 1)
        except OSError as exc:
            log.warning("subtitle sidecar unreadable",
                        extra={"key": item.sidecar_key, "error": str(exc)[:300]})
            return None
        if len(data) > SIDECAR_MAX_BYTES:
            log.warning("subtitle sidecar too large",
                        extra={"key": item.sidecar_key, "limit": SIDECAR_MAX_BYTES})
            return None
        return extract.Sidecar(item.sidecar_key, data)

    def _finish(self, item: jobs.ItemClaim, outcome: sandbox.Outcome,
                labeler: Labeler = NO_LABELS) -> _Written | None:
        """Write one file and complete its item in one transaction (a writer thread). What it counts for
        the run, or None when the item was not completed here (lease lost, handed back, or released after
        an error). `labeler`: the file's labels from its source's config and its own tags.

        The file's deadline (KDBL_FILE_DEADLINE_S) covers its extraction (`outcome.seconds`), the counting
        of its tokens and its write: the write gets what is left (kdbl_worker.deadlines)."""
        if self._halted():  # stopped, or the database's disk is full, before its turn: hand it back
            with self.pool.connection() as conn:
                jobs.release_unstarted(conn, [item])
            return None
        began = time.monotonic()
        self.activity.begin(item.id, item.file.key)
        meta = replace(item.file, content_type=outcome.content_type)
        rows = chunk_rows(outcome.chunks, self.count_tokens)
        members = member_files(item.file.key, item.file.mtime, outcome.children, labeler, self.count_tokens)
        status, reason, then = outcome.status, outcome.reason, []
        try:
            members, status, reason, then = member_keys.settle(self.pool, item, members, status, reason)
        except Exception as exc:  # noqa: BLE001 - the store keeps a listed file's key either way (unreported)
            log.warning("member key check failed", extra={"key": item.file.key, "error": repr(exc)[:300]})
        chunks = len(rows) + sum(len(m.chunks) for m in members)
        left = self.file_deadline_s - outcome.seconds - (time.monotonic() - began)
        if left <= 0:
            return self._past_deadline(item, outcome, chunks, None, None)
        writer = self._file_writer()
        with self.watchdog.watch(item.id, left) as ticket:
            try:
                writer.write(
                    tenant_id=item.tenant_id, source_id=item.source_id, meta=meta,
                    status=status, status_reason=reason, title=outcome.title, chunks=rows,
                    text_chars=outcome.text_chars, ts_config=self.settings.text_search_config,
                    replace=item.had_file, durable=self.durable,
                    then=[*then, jobs.complete_item_statement(item.id, item.lease, status=status, chunks=chunks)],
                    members=members, container=containers.is_container(item.file.key),
                    authors=outcome.authors, labels=labeler(item.file.key, outcome.tags),
                    own_labels=own_labels(outcome.tags),
                )
            except store.FenceLost:
                log.warning("item lease lost; another worker indexes it",
                            extra={"key": item.file.key, "item_id": item.id})
                return None
            except Exception as exc:  # noqa: BLE001 - classified below
                error = exc
            else:
                return _Written(1, chunks, 1 if status == "failed" else 0)
        if ticket.fired == "stop":  # rolled back by the stop: handed back, the attempt does not count
            with self.pool.connection() as conn:
                jobs.release_unstarted(conn, [item])
            return None
        if (ticket.fired == "deadline" or getattr(error, "sqlstate", None) in deadlines.TIMEOUT_STATES
                or time.monotonic() >= ticket.deadline):
            return self._past_deadline(item, outcome, chunks, error, ticket.elapsed())
        if (cause := disk_full_cause(error)) is not None:
            self._disk_full(item, cause)
            return None
        cause = _cause(error)
        log.warning("writing a file failed", extra={"key": item.file.key, "cause": cause,
                                                    "error": repr(error)[:500]})
        give_up = item.lease.attempt >= self.max_attempts
        with self.pool.connection() as conn:  # retried (another attempt, maybe elsewhere)
            released = jobs.release_item(conn, item.id, item.lease, error=cause[:2000], give_up=give_up)
        return _Written(0, 0, 1) if give_up and released else None

    def _past_deadline(self, item: jobs.ItemClaim, outcome: sandbox.Outcome, chunks: int,
                       error: BaseException | None, writing_s: float | None) -> _Written:
        spent = f"extraction {outcome.seconds:.1f} s" + (f", writing {writing_s:.1f} s" if writing_s is not None
                                                        else ", not written")
        reason = (f"indexing took longer than the per-file deadline of {self.file_deadline_s:g} s "
                  f"(KDBL_FILE_DEADLINE_S; {spent}); {chunks} chunks, {item.file.size} bytes")
        log.warning("file write past its deadline", extra={"key": item.file.key, "error": repr(error)[:300]})
        self._record_failed(item, outcome.content_type, reason, retry=True)
        return _Written(0, 0, 1)

    def _halted(self) -> bool:
        return (self._stop is not None and self._stop.is_set()) or self._full is not None

    def _disk_full(self, item: jobs.ItemClaim, cause: str) -> None:
        """The database's disk is full: hand the file back (the attempt does not count, the cause is its
        last error) and stop processing (see kdbl_worker.queue)."""
        log.error("writing a file failed: the database's disk is full", extra={
            "key": item.file.key, "sqlstate": DISK_FULL, "cause": cause})
        with self._lock:
            if self._full is None:
                self._full = DatabaseFull(f"the database's disk is full ({cause})", cause=cause)
        try:
            with self.pool.connection() as conn:
                jobs.release_item(conn, item.id, item.lease, error=cause, unstarted=True)
        except Exception as exc:  # noqa: BLE001 - its lease runs out instead
            log.warning("could not hand a file back", extra={"key": item.file.key, "error": repr(exc)[:300]})

    def _record_failed(self, item: jobs.ItemClaim | jobs.GivenUp, content_type: str | None, reason: str, *,
                       retry: bool = False) -> None:
        """The file's row says `failed: reason` (old chunks dropped, as for any failed extraction) and, for a
        claimed item, the item is failed with the reason. The next crawl skips the file until it changes,
        unless `retry` (a deadline may have been a passing overload): then its stat is not stored."""
        meta = FileMeta(key=item.file.key, size=item.file.size, mtime=None if retry else item.file.mtime,
                        etag=None if retry else item.file.etag,
                        content_type=content_type or extract.detect(item.file.key)[0])
        try:
            with tenant_transaction(self.pool, item.tenant_id) as conn:
                timeout_ms = int(min(RECORD_TIMEOUT_MS, self.file_deadline_s * 1000))
                conn.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
                if isinstance(item, jobs.ItemClaim) and not jobs.release_item(conn, item.id, item.lease,
                                                                              error=reason, give_up=True):
                    return  # another worker holds it now
                store.write_file(conn, tenant_id=item.tenant_id, source_id=item.source_id, meta=meta,
                                   status="failed", status_reason=reason[:1000], title=None, chunks=[],
                                   text_chars=0, ts_config=self.settings.text_search_config,
                                   container=containers.is_container(item.file.key))
        except Exception as exc:  # noqa: BLE001 - e.g. the lock that stopped the write is still held
            if isinstance(item, jobs.ItemClaim) and (cause := disk_full_cause(exc)) is not None:
                self._disk_full(item, cause)  # left queued, not failed: the file is not at fault
                return
            log.warning("could not record a failed file", extra={"key": item.file.key, "cause": _cause(exc),
                                                                 "error": repr(exc)[:300]})
            if isinstance(item, jobs.ItemClaim):
                with self.pool.connection() as conn:
                    jobs.release_item(conn, item.id, item.lease, error=reason, give_up=True)

    def record_given_up(self, items: list[jobs.GivenUp]) -> None:
        """Files the queue gave up on (poison files) get their failed row, so the next crawl skips them
        until they change."""
        for item in items:
            self._record_failed(item, None, item.reason or "given up")


def chunk_rows(chunks: list[tuple], count: Callable[[str], int]) -> list[Chunk]:
    """The sandbox's chunk tuples as rows, each with its text's length in tokens (kdbl_worker.token_counts)."""
    return [Chunk(*c, text_tokens=count(c[1])) for c in chunks]


def member_files(parent_key: str, mtime, children: list[sandbox.Child], labeler: Labeler = NO_LABELS,
                 count_tokens: Callable[[str], int] = token_counts.estimate) -> list[store.MemberFile]:
    """A container's members (all levels) as child rows: key = parent key + '!/' + member path, the
    member's size, the parent's mtime. A path seen twice in one archive keeps its first entry; a key
    longer than MAX_MEMBER_KEY_BYTES is left out (with what it holds) and logged."""
    out: list[store.MemberFile] = []
    seen: set[str] = set()

    def walk(prefix: str, kids: list[sandbox.Child]) -> None:
        for kid in kids:
            key = _clean(prefix + containers.MEMBER_SEP + kid.path)
            if key in seen:
                continue
            if len(key.encode("utf-8")) > MAX_MEMBER_KEY_BYTES:
                log.warning("member key too long", extra={"key": key[:300], "limit": MAX_MEMBER_KEY_BYTES})
                continue
            seen.add(key)
            o = kid.outcome
            out.append(store.MemberFile(
                FileMeta(key=key, size=kid.size, mtime=mtime, content_type=o.content_type),
                o.status, o.reason, o.title, chunk_rows(o.chunks, count_tokens), o.text_chars,
                authors=o.authors, labels=labeler(key, o.tags), own_labels=own_labels(o.tags)))
            walk(key, o.children)

    walk(parent_key, children)
    return out
