"""The crawl job queue (tables from migration 0003): enqueue, claim with leases, heartbeat, complete.

A *job* is one crawl run of a source; its changed files become *items*. Workers claim with
`FOR UPDATE SKIP LOCKED`, so replicas never block on or duplicate each other's claims. Every claim
increments `attempts`; (leased_by, attempts) is the fencing token a holder presents when it completes
or releases a row, so a worker whose lease expired and was taken over changes nothing.

Claims, heartbeats and finalisation run outside any tenant (the worker serves every tenant); an item
is completed inside the tenant transaction that writes its file (`complete_item`).

A lease proves progress, not only life: the heartbeat renews a holder's leases only while its work moves
(`heartbeat(renew=False)` lets them run out) and stamps `started_at` on the items it is actually
extracting or writing. A lease that expires on a started item is a *break* (its holder died or stalled
with that file in hand); at `max_breaks` (2) the file is given up as a poison file (`sweep`) instead of
breaking a third worker. A tenant whose settings say `enabled: false` is skipped by every claim and by
the scheduler; its open runs resume when it is enabled again.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kdbl_core.content.records import FileMeta
from kdbl_core.content.store import FenceLost, Statement
from kdbl_core.db.connect import Connection
from kdbl_core.errors import PermanentError

MAX_BREAKS = 2

# The tenant of `col` is not disabled (tenants.settings.enabled = false; kdbl_core.access.policy reads it the same way).
_TENANT_ON = "NOT EXISTS (SELECT 1 FROM tenants t WHERE t.id = {col} AND t.settings -> 'enabled' = 'false'::jsonb)"


class TenantDisabled(PermanentError):
    """The source's tenant is disabled: its sources are not crawled until it is enabled again."""


class LeaseLost(FenceLost):
    """The row's lease was taken over by another worker (ours expired): do not commit."""


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a claim: the worker id and the attempt number the claim produced (the fence)."""

    holder: str
    attempt: int


@dataclass(frozen=True, slots=True)
class JobClaim:
    id: int
    tenant_id: uuid.UUID
    source_id: uuid.UUID
    reason: str
    lease: Lease


@dataclass(frozen=True, slots=True)
class ItemClaim:
    """A claimed queue item: its queue identity and lease, and the file as it was listed."""

    id: int
    job_id: int
    tenant_id: uuid.UUID
    source_id: uuid.UUID
    file: FileMeta
    had_file: bool
    lease: Lease
    sidecar_key: str | None = None


@dataclass(frozen=True, slots=True)
class ItemRow:
    """What a listing queues for one changed file: the file as listed, whether it was indexed before,
    and its subtitle sidecar."""

    file: FileMeta
    had_file: bool = True
    sidecar_key: str | None = None  # a subtitle file next to a media file (see kdbl_worker.sidecars)


@dataclass(frozen=True, slots=True)
class JobStatus:
    id: int
    source_id: uuid.UUID
    state: str
    attempts: int
    last_error: str | None
    listed: int
    excluded: int
    unchanged: int
    deleted: int
    queued_files: int
    indexed: int
    failed: int
    chunks: int
    bytes: int
    problems: list[tuple[str, str]]
    pending: int
    tenant_enabled: bool = True


@dataclass(frozen=True, slots=True)
class GivenUp:
    """An item `sweep` gave up on (its file is recorded failed with `reason` by the worker)."""

    id: int
    tenant_id: uuid.UUID
    source_id: uuid.UUID
    file: FileMeta  # key, size, mtime, etag (what recording it needs)
    reason: str


def _lease_secs(seconds: float) -> float:
    return max(float(seconds), 0.1)


# ---------------------------------------------------------------------------------------------
# Enqueue
# ---------------------------------------------------------------------------------------------
_ENQUEUE = """
INSERT INTO crawl_jobs (tenant_id, source_id, reason)
SELECT s.tenant_id, s.id, 'manual' FROM sources s WHERE s.id = %(sid)s
ON CONFLICT DO NOTHING
RETURNING id
"""
_QUEUED_FOR = "SELECT id FROM crawl_jobs WHERE source_id = %(sid)s AND state = 'queued'"
_TENANT_OF = """
SELECT t.name, t.settings -> 'enabled' = 'false'::jsonb AS disabled
  FROM sources s JOIN tenants t ON t.id = s.tenant_id WHERE s.id = %(sid)s
"""


def enqueue(conn: Connection, source_id: uuid.UUID) -> int:
    """Queue an on-demand crawl of a source, or join the one already queued (not yet started) for it.

    A run that is already listing or running may have missed recent changes, so a new one is queued
    behind it. Returns the job id. TenantDisabled when the source's tenant is disabled.
    """
    tenant = conn.execute(_TENANT_OF, {"sid": source_id}).fetchone()
    if tenant is not None and tenant.disabled:
        raise TenantDisabled(f"tenant {tenant.name} is disabled: its sources are not crawled "
                             f"(enable it with `kdbl-control tenant update {tenant.name} --enabled true`)")
    for _ in range(5):
        row = conn.execute(_ENQUEUE, {"sid": source_id}).fetchone()
        if row is None:
            row = conn.execute(_QUEUED_FOR, {"sid": source_id}).fetchone()
        if row is not None:
            return row.id
        if conn.execute("SELECT 1 FROM sources WHERE id = %(sid)s", {"sid": source_id}).fetchone() is None:
            raise LookupError(f"no source {source_id}")
    raise RuntimeError(f"could not queue a crawl of source {source_id}")  # pragma: no cover - a claim race


_SCHEDULE_INPUT = f"""
SELECT now() AS now, s.id, s.schedule FROM sources s
 WHERE s.enabled AND {_TENANT_ON.format(col="s.tenant_id")}
   AND (CAST(%(tenants)s AS text[]) IS NULL
                      OR s.tenant_id IN (SELECT t.id FROM tenants t
                                          WHERE t.name = ANY (CAST(%(tenants)s AS text[]))))
"""

# One run per schedule slot and source. A run created at or after the slot (an on-demand one too)
# already serves it; the unique index on (source_id, scheduled_for) settles two schedulers racing.
_ENQUEUE_DUE = f"""
INSERT INTO crawl_jobs (tenant_id, source_id, reason, scheduled_for)
SELECT s.tenant_id, s.id, 'schedule', d.slot
  FROM unnest(CAST(%(sids)s AS uuid[]), CAST(%(slots)s AS timestamptz[])) AS d(sid, slot)
  JOIN sources s ON s.id = d.sid AND s.enabled AND {_TENANT_ON.format(col="s.tenant_id")}
 WHERE NOT EXISTS (SELECT 1 FROM crawl_jobs j
                    WHERE j.source_id = d.sid AND (j.created_at >= d.slot OR j.scheduled_for >= d.slot))
ON CONFLICT DO NOTHING
RETURNING id
"""


def schedule_input(conn: Connection, tenants: Sequence[str] | None = None) -> tuple[datetime, list[tuple]]:
    """(database time, [(source id, schedule text)]) for the enabled sources (optionally of some tenants)."""
    rows = conn.execute(_SCHEDULE_INPUT, {"tenants": list(tenants) if tenants else None}).fetchall()
    if not rows:
        return conn.execute("SELECT now()").fetchone()[0], []
    return rows[0].now, [(r.id, r.schedule) for r in rows]


def enqueue_due(conn: Connection, slots: Sequence[tuple[uuid.UUID, datetime]]) -> list[int]:
    """Queue one scheduled run per (source, slot) unless a run at or after that slot exists."""
    if not slots:
        return []
    params = {"sids": [s for s, _ in slots], "slots": [t for _, t in slots]}
    return [r.id for r in conn.execute(_ENQUEUE_DUE, params)]


# ---------------------------------------------------------------------------------------------
# Jobs: claim the listing, finish it, fail it
# ---------------------------------------------------------------------------------------------
_CLAIM_JOB = f"""
UPDATE crawl_jobs j
   SET state = 'listing', leased_by = %(holder)s, lease_expires_at = now() + make_interval(secs => %(lease)s),
       attempts = j.attempts + 1, started_at = coalesce(j.started_at, now())
 WHERE j.id = (
       SELECT c.id FROM crawl_jobs c
        WHERE c.state IN ('queued', 'listing')
          AND ((c.state = 'queued' AND c.run_after <= now()
                AND NOT EXISTS (SELECT 1 FROM crawl_jobs a
                                 WHERE a.source_id = c.source_id AND a.state IN ('listing', 'running')))
               OR (c.state = 'listing' AND c.lease_expires_at < now() AND c.attempts < %(max_attempts)s))
          AND (CAST(%(source)s AS uuid) IS NULL OR c.source_id = CAST(%(source)s AS uuid))
          AND (CAST(%(tenants)s AS text[]) IS NULL
               OR c.tenant_id IN (SELECT t.id FROM tenants t WHERE t.name = ANY (CAST(%(tenants)s AS text[]))))
          AND {_TENANT_ON.format(col="c.tenant_id")}
        ORDER BY c.run_after, c.id
        LIMIT 1
        FOR UPDATE SKIP LOCKED)
RETURNING j.id, j.tenant_id, j.source_id, j.reason, j.attempts
"""


def claim_job(conn: Connection, holder: str, *, lease_s: float, max_attempts: int,
              source_id: uuid.UUID | None = None, tenants: Sequence[str] | None = None) -> JobClaim | None:
    """Take the listing of the oldest due job (or of one whose lister's lease expired)."""
    row = conn.execute(_CLAIM_JOB, {
        "holder": holder, "lease": _lease_secs(lease_s), "max_attempts": max_attempts, "source": source_id,
        "tenants": list(tenants) if tenants else None,
    }).fetchone()
    if row is None:
        return None
    return JobClaim(row.id, row.tenant_id, row.source_id, row.reason, Lease(holder, row.attempts))


_FENCE_JOB = "id = %(id)s AND state = 'listing' AND leased_by = %(holder)s AND attempts = %(attempt)s"

_INSERT_ITEMS = """
INSERT INTO crawl_items (job_id, tenant_id, source_id, key, size, mtime, etag, storage_class, owner, mode,
                         uid, gid, had_file, sidecar_key, permission_set)
SELECT j.id, j.tenant_id, j.source_id, u.key, u.size, u.mtime, u.etag, u.storage_class, u.owner, u.mode,
       u.uid, u.gid, u.had_file, u.sidecar_key, u.permission_set
  FROM crawl_jobs j,
       unnest(CAST(%(keys)s AS text[]), CAST(%(sizes)s AS bigint[]), CAST(%(mtimes)s AS timestamptz[]),
              CAST(%(etags)s AS text[]), CAST(%(classes)s AS text[]), CAST(%(owners)s AS text[]),
              CAST(%(modes)s AS int[]), CAST(%(uids)s AS int[]), CAST(%(gids)s AS int[]), CAST(%(had)s AS boolean[]),
              CAST(%(sidecars)s AS text[]), CAST(%(sets)s AS bigint[]))
         AS u(key, size, mtime, etag, storage_class, owner, mode, uid, gid, had_file, sidecar_key, permission_set)
 WHERE j.id = %(id)s AND j.state = 'listing' AND j.leased_by = %(holder)s AND j.attempts = %(attempt)s
ON CONFLICT (job_id, key) DO NOTHING
"""


def _fence_ok(conn: Connection, job_id: int, lease: Lease) -> bool:
    return conn.execute(f"SELECT 1 FROM crawl_jobs WHERE {_FENCE_JOB}",
                        {"id": job_id, "holder": lease.holder, "attempt": lease.attempt}).fetchone() is not None


def add_items(conn: Connection, job_id: int, lease: Lease, items: Sequence[ItemRow]) -> int:
    """Queue changed files of a listing (idempotent per key: a re-listing after a takeover adds no twins)."""
    if not items:
        return 0
    result = conn.execute(_INSERT_ITEMS, {
        "id": job_id, "holder": lease.holder, "attempt": lease.attempt,
        "keys": [i.file.key for i in items], "sizes": [i.file.size for i in items],
        "mtimes": [i.file.mtime for i in items], "etags": [i.file.etag for i in items],
        "classes": [i.file.storage_class for i in items], "owners": [i.file.owner for i in items],
        "modes": [i.file.mode for i in items], "uids": [i.file.uid for i in items],
        "gids": [i.file.gid for i in items], "had": [i.had_file for i in items],
        "sidecars": [i.sidecar_key for i in items], "sets": [i.file.permission_set for i in items],
    })
    if result.rowcount == 0 and not _fence_ok(conn, job_id, lease):
        raise LeaseLost(f"job {job_id}: listing lease lost")
    return result.rowcount


_FINISH_LISTING = f"""
UPDATE crawl_jobs
   SET state = 'running', listed_at = now(), leased_by = NULL, lease_expires_at = NULL, last_error = NULL,
       listed = %(listed)s, excluded = %(excluded)s, unchanged = %(unchanged)s, deleted = %(deleted)s,
       queued_files = (SELECT count(*) FROM crawl_items WHERE job_id = %(id)s),
       problems = CAST(%(problems)s AS jsonb)
 WHERE {_FENCE_JOB}
RETURNING id
"""


def lock_listing(conn: Connection, job_id: int, lease: Lease) -> None:
    """Lock the job row for the transaction that ends its listing; LeaseLost if it is no longer ours."""
    row = conn.execute(f"SELECT id FROM crawl_jobs WHERE {_FENCE_JOB} FOR UPDATE",
                       {"id": job_id, "holder": lease.holder, "attempt": lease.attempt}).fetchone()
    if row is None:
        raise LeaseLost(f"job {job_id}: listing lease lost")


def finish_listing(conn: Connection, job_id: int, lease: Lease, *, listed: int, excluded: int, unchanged: int,
                   deleted: int, problems: Sequence[tuple[str, str]]) -> None:
    """The listing is complete: the job's items are all queued; from now on any worker may finish it."""
    row = conn.execute(_FINISH_LISTING, {
        "id": job_id, "holder": lease.holder, "attempt": lease.attempt, "listed": listed,
        "excluded": excluded, "unchanged": unchanged, "deleted": deleted,
        "problems": json.dumps([list(p) for p in problems[:1000]]),
    }).fetchone()
    if row is None:
        raise LeaseLost(f"job {job_id}: listing lease lost")


_FAIL_JOB = f"""
WITH j AS (
    UPDATE crawl_jobs SET state = 'failed', finished_at = now(), leased_by = NULL, lease_expires_at = NULL,
                          last_error = %(error)s, problems = CAST(%(problems)s AS jsonb)
     WHERE {_FENCE_JOB}
    RETURNING id
)
UPDATE crawl_items SET state = 'failed', last_error = 'crawl aborted: ' || %(error)s, finished_at = now()
 WHERE job_id IN (SELECT id FROM j) AND state = 'queued'
"""


def fail_listing(conn: Connection, job_id: int, lease: Lease, error: str,
                 problems: Sequence[tuple[str, str]] = ()) -> None:
    """The source could not be listed: the run fails, nothing is deleted, its unstarted items are dropped."""
    problems_json = json.dumps([list(p) for p in problems[:1000]])
    conn.execute(_FAIL_JOB, {"id": job_id, "holder": lease.holder, "attempt": lease.attempt,
                             "error": error[:2000], "problems": problems_json})


_RELEASE_LISTING = f"UPDATE crawl_jobs SET lease_expires_at = now() - interval '1 second' WHERE {_FENCE_JOB}"


def release_listing(conn: Connection, job_id: int, lease: Lease) -> None:
    """Give the listing up (graceful stop): its lease expires now, so another worker lists again at once."""
    conn.execute(_RELEASE_LISTING, {"id": job_id, "holder": lease.holder, "attempt": lease.attempt})


# ---------------------------------------------------------------------------------------------
# Items: claim, complete (inside the file's transaction), release
# ---------------------------------------------------------------------------------------------
# MATERIALIZED: the pick runs exactly once. As a plain sub-select in FROM the planner may put it on the
# inner side of a nested loop and re-run it per row, each run locking and returning up to :n more rows.
# Taking over an expired lease on a started item counts a break; an item at its last break is left to
# `sweep` (given up), never claimed.
_CLAIM_ITEMS = f"""
WITH picked AS MATERIALIZED (
    SELECT c.id FROM crawl_items c
     WHERE c.state IN ('queued', 'running')
       AND (c.state = 'queued' OR (c.lease_expires_at < now() AND c.attempts < %(max_attempts)s
                                   AND (c.started_at IS NULL OR c.breaks + 1 < %(max_breaks)s)))
       AND (CAST(%(source)s AS uuid) IS NULL OR c.source_id = CAST(%(source)s AS uuid))
       AND (CAST(%(tenants)s AS text[]) IS NULL
            OR c.tenant_id IN (SELECT t.id FROM tenants t WHERE t.name = ANY (CAST(%(tenants)s AS text[]))))
       AND {_TENANT_ON.format(col="c.tenant_id")}
     ORDER BY c.id
     LIMIT %(n)s
     FOR UPDATE SKIP LOCKED)
UPDATE crawl_items i
   SET state = 'running', leased_by = %(holder)s, lease_expires_at = now() + make_interval(secs => %(lease)s),
       attempts = i.attempts + 1, started_at = NULL,
       breaks = i.breaks + CASE WHEN i.state = 'running' AND i.started_at IS NOT NULL THEN 1 ELSE 0 END
  FROM picked
 WHERE i.id = picked.id
RETURNING i.id, i.job_id, i.tenant_id, i.source_id, i.key, i.size, i.mtime, i.etag, i.storage_class, i.owner,
          i.mode, i.uid, i.gid, i.had_file, i.attempts, i.sidecar_key, i.permission_set
"""


def claim_items(conn: Connection, holder: str, *, n: int, lease_s: float, max_attempts: int,
                source_id: uuid.UUID | None = None, tenants: Sequence[str] | None = None,
                max_breaks: int = MAX_BREAKS) -> list[ItemClaim]:
    rows = conn.execute(_CLAIM_ITEMS, {
        "holder": holder, "lease": _lease_secs(lease_s), "max_attempts": max_attempts, "n": n,
        "max_breaks": max_breaks,
        "source": source_id, "tenants": list(tenants) if tenants else None,
    }).fetchall()
    return sorted((ItemClaim(r.id, r.job_id, r.tenant_id, r.source_id,
                             FileMeta(r.key, r.size, r.mtime, r.etag, r.storage_class, r.owner, r.mode, r.uid,
                                      r.gid, permission_set=r.permission_set),
                             r.had_file, Lease(holder, r.attempts), r.sidecar_key)
                   for r in rows), key=lambda c: c.id)


_FENCE_ITEM = "id = %(id)s AND state = 'running' AND leased_by = %(holder)s AND attempts = %(attempt)s"

_COMPLETE_ITEM = f"""
UPDATE crawl_items SET state = 'done', finished_at = now(), lease_expires_at = NULL, last_error = NULL,
                       file_status = %(status)s, chunk_count = %(chunks)s
 WHERE {_FENCE_ITEM}
"""


def complete_item(conn: Connection, item_id: int, lease: Lease, *, status: str, chunks: int) -> None:
    """Mark an item done in the transaction that writes its file; LeaseLost (roll back) if not ours."""
    result = conn.execute(_COMPLETE_ITEM, {"id": item_id, "holder": lease.holder, "attempt": lease.attempt,
                                           "status": status, "chunks": chunks})
    if result.rowcount != 1:
        raise LeaseLost(f"item {item_id}: lease lost")


# The same, as a statement that aborts its transaction (SQLSTATE KL001) when the fence does not hold:
# for a pipelined file transaction whose COMMIT is sent before this result is read.
_COMPLETE_ITEM_CHECKED = f"""
WITH done AS (
    UPDATE crawl_items SET state = 'done', finished_at = now(), lease_expires_at = NULL, last_error = NULL,
                           file_status = %(status)s, chunk_count = %(chunks)s
     WHERE {_FENCE_ITEM}
    RETURNING 1
)
SELECT kdbl_check((SELECT count(*) FROM done) = 1, 'KL001', 'lease lost on queue item ' || %(id)s)
"""


def complete_item_statement(item_id: int, lease: Lease, *, status: str,
                            chunks: int) -> Statement:
    """`complete_item` for `content.FileWriter.write(then=...)`: a lost lease raises FenceLost there."""
    return _COMPLETE_ITEM_CHECKED, {"id": item_id, "holder": lease.holder, "attempt": lease.attempt,
                                    "status": status, "chunks": chunks}


_RELEASE_ITEM = f"""
UPDATE crawl_items
   SET state = CASE WHEN %(give_up)s THEN 'failed' ELSE 'queued' END, leased_by = NULL, lease_expires_at = NULL,
       attempts = attempts - CASE WHEN %(unstarted)s THEN 1 ELSE 0 END, started_at = NULL,
       last_error = coalesce(%(error)s, last_error),
       finished_at = CASE WHEN %(give_up)s THEN now() END
 WHERE {_FENCE_ITEM}
"""


def release_item(conn: Connection, item_id: int, lease: Lease, *, error: str | None = None,
                 give_up: bool = False, unstarted: bool = False) -> int:
    """Hand an item back: unstarted (graceful stop, the attempt does not count), after an error (retried
    by any worker), or give up on it (state failed). Returns 0 when the lease was no longer ours."""
    return conn.execute(_RELEASE_ITEM, {"id": item_id, "holder": lease.holder, "attempt": lease.attempt,
                                 "error": error[:2000] if error else None, "give_up": give_up,
                                 "unstarted": unstarted}).rowcount


_RELEASE_UNSTARTED = """
UPDATE crawl_items SET state = 'queued', leased_by = NULL, lease_expires_at = NULL, attempts = attempts - 1,
                       started_at = NULL
 WHERE state = 'running' AND leased_by = %(holder)s
   AND (id, attempts) IN (SELECT * FROM unnest(CAST(%(ids)s AS bigint[]), CAST(%(attempts)s AS int[])))
"""


def release_unstarted(conn: Connection, claims: Sequence[ItemClaim]) -> None:
    """Hand back items this worker claimed but did not start (graceful stop): the claim does not count."""
    if claims:
        conn.execute(_RELEASE_UNSTARTED, {"holder": claims[0].lease.holder, "ids": [c.id for c in claims],
                                          "attempts": [c.lease.attempt for c in claims]})


# ---------------------------------------------------------------------------------------------
# Heartbeat, finalisation, housekeeping
# ---------------------------------------------------------------------------------------------
# SKIP LOCKED: a row locked by its holder's own file transaction is being completed right now; the
# heartbeat must never wait behind it (or behind anything).
_HEARTBEAT = """
WITH items AS (
    UPDATE crawl_items
       SET lease_expires_at = CASE WHEN %(renew)s AND NOT (id = ANY (CAST(%(overdue)s AS bigint[])))
                                   THEN now() + make_interval(secs => %(lease)s) ELSE lease_expires_at END,
           started_at = CASE WHEN id = ANY (CAST(%(started)s AS bigint[])) THEN coalesce(started_at, now())
                             ELSE started_at END
     WHERE id IN (SELECT id FROM crawl_items WHERE state = 'running' AND leased_by = %(holder)s
                  FOR UPDATE SKIP LOCKED)
    RETURNING lease_expires_at > now() + make_interval(secs => %(lease)s / 2) AS renewed
), jobs AS (
    UPDATE crawl_jobs SET lease_expires_at = now() + make_interval(secs => %(lease)s)
     WHERE %(renew)s AND id IN (SELECT id FROM crawl_jobs WHERE state = 'listing' AND leased_by = %(holder)s
                             FOR UPDATE SKIP LOCKED)
    RETURNING 1
)
SELECT (SELECT count(*) FILTER (WHERE renewed) FROM items) + (SELECT count(*) FROM jobs)
"""


def heartbeat(conn: Connection, holder: str, *, lease_s: float, renew: bool = True,
              started: Sequence[int] = (), overdue: Sequence[int] = ()) -> int:
    """Extend the leases `holder` has (all, when `renew`, except `overdue` items) and stamp `started`
    items as in progress; returns how many leases it renewed."""
    return conn.execute(_HEARTBEAT, {"holder": holder, "lease": _lease_secs(lease_s), "renew": renew,
                                     "started": list(started), "overdue": list(overdue)}).fetchone()[0]


_FINALIZE = """
WITH cand AS (
    SELECT j.id FROM crawl_jobs j
     WHERE j.state = 'running'
       AND (CAST(%(source)s AS uuid) IS NULL OR j.source_id = CAST(%(source)s AS uuid))
       AND NOT EXISTS (SELECT 1 FROM crawl_items i WHERE i.job_id = j.id AND i.state IN ('queued', 'running'))
     FOR UPDATE SKIP LOCKED
), agg AS (
    SELECT i.job_id,
           count(*) FILTER (WHERE i.state = 'done') AS indexed,
           count(*) FILTER (WHERE i.state = 'failed' OR i.file_status = 'failed') AS failed,
           coalesce(sum(i.chunk_count) FILTER (WHERE i.state = 'done'), 0) AS chunks,
           coalesce(sum(i.size) FILTER (WHERE i.state = 'done'), 0) AS bytes
      FROM crawl_items i WHERE i.job_id IN (SELECT id FROM cand) GROUP BY i.job_id
), fails AS (  -- why items failed (deadline, poison file, ...) joins the run's problems
    SELECT cand.id AS job_id,
           (SELECT coalesce(jsonb_agg(jsonb_build_array(f.key, f.last_error)), '[]'::jsonb)
              FROM (SELECT i.key, i.last_error FROM crawl_items i
                     WHERE i.job_id = cand.id AND i.state = 'failed' AND i.last_error IS NOT NULL
                     ORDER BY i.id LIMIT 100) f) AS list
      FROM cand
), done AS (
    UPDATE crawl_jobs j
       SET state = 'done', finished_at = now(), indexed = coalesce(agg.indexed, 0),
           failed = coalesce(agg.failed, 0), chunks = coalesce(agg.chunks, 0), bytes = coalesce(agg.bytes, 0),
           problems = j.problems || fails.list
      FROM cand LEFT JOIN agg ON agg.job_id = cand.id JOIN fails ON fails.job_id = cand.id
     WHERE j.id = cand.id
    RETURNING j.id, j.source_id
), marked AS (
    UPDATE sources SET last_indexed_at = now() WHERE id IN (SELECT source_id FROM done) RETURNING id
)
SELECT id FROM done
"""


def tenants_of(conn: Connection, job_ids: list[int]) -> list[uuid.UUID]:
    """The tenants of these crawl runs, each once."""
    rows = conn.execute("SELECT DISTINCT tenant_id FROM crawl_jobs WHERE id = ANY(%(ids)s) ORDER BY 1", {"ids": job_ids})
    return [r.tenant_id for r in rows]


def finalize(conn: Connection, source_id: uuid.UUID | None = None) -> list[int]:
    """Close every running job whose items are all finished (and stamp its source's last_indexed_at)."""
    return [r.id for r in conn.execute(_FINALIZE, {"source": source_id})]


_SWEEP = """
WITH items AS (
    UPDATE crawl_items
       SET state = 'failed', finished_at = now(), leased_by = NULL, lease_expires_at = NULL,
           breaks = breaks + CASE WHEN started_at IS NOT NULL THEN 1 ELSE 0 END,
           last_error = CASE WHEN started_at IS NOT NULL AND breaks + 1 >= %(max_breaks)s
                             THEN 'poison file: a worker died or stopped making progress while indexing it, '
                                  || (breaks + 1) || ' times; not retried until it changes'
                             ELSE coalesce(last_error || '; ', '') || 'gave up after ' || attempts
                                  || ' expired leases' END
     WHERE id IN (SELECT id FROM crawl_items WHERE state = 'running' AND lease_expires_at < now()
                     AND (attempts >= %(max_attempts)s OR (started_at IS NOT NULL AND breaks + 1 >= %(max_breaks)s))
                   FOR UPDATE SKIP LOCKED)
    RETURNING id, tenant_id, source_id, key, size, mtime, etag, last_error
), jobs AS (
    UPDATE crawl_jobs
       SET state = 'failed', finished_at = now(), leased_by = NULL, lease_expires_at = NULL,
           last_error = coalesce(last_error || '; ', '')
                        || 'listing abandoned after ' || attempts || ' attempts'
     WHERE id IN (SELECT id FROM crawl_jobs WHERE state = 'listing' AND lease_expires_at < now()
                     AND attempts >= %(max_attempts)s FOR UPDATE SKIP LOCKED)
    RETURNING id
), dropped AS (
    UPDATE crawl_items SET state = 'failed', finished_at = now(), last_error = 'crawl aborted'
     WHERE job_id IN (SELECT id FROM jobs) AND state = 'queued'
    RETURNING 1
)
SELECT 'item' AS kind, id, tenant_id, source_id, key, size, mtime, etag, last_error FROM items
UNION ALL
SELECT 'job', id, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM jobs
"""


def sweep(conn: Connection, *, max_attempts: int, max_breaks: int = MAX_BREAKS) -> list[GivenUp]:
    """Give up on items whose lease expired `max_attempts` times or on `max_breaks` started ones (poison
    files), and on listings that expired `max_attempts` times; returns the items given up."""
    rows = conn.execute(_SWEEP, {"max_attempts": max_attempts, "max_breaks": max_breaks}).fetchall()
    return [GivenUp(r.id, r.tenant_id, r.source_id, FileMeta(r.key, r.size, r.mtime, r.etag), r.last_error)
            for r in rows if r.kind == "item"]


# Finished runs are kept for `days` (their items for a day), but never a source's newest run: it is
# what tells the scheduler that the current slot is served.
_PRUNE = """
WITH old_items AS (
    DELETE FROM crawl_items WHERE id IN (
        SELECT i.id FROM crawl_items i JOIN crawl_jobs j ON j.id = i.job_id
         WHERE j.state IN ('done', 'failed') AND j.finished_at < now() - interval '1 day' LIMIT 10000)
    RETURNING 1
), old_jobs AS (
    DELETE FROM crawl_jobs j WHERE j.id IN (
        SELECT o.id FROM crawl_jobs o
         WHERE o.state IN ('done', 'failed') AND o.finished_at < now() - make_interval(days => %(days)s)
           AND EXISTS (SELECT 1 FROM crawl_jobs n
                        WHERE n.source_id = o.source_id AND n.created_at > o.created_at)
         LIMIT 1000)
    RETURNING 1
)
SELECT (SELECT count(*) FROM old_items) + (SELECT count(*) FROM old_jobs)
"""


def prune(conn: Connection, *, days: int = 7) -> int:
    return conn.execute(_PRUNE, {"days": days}).fetchone()[0]


_OPEN_RUNS = f"""
SELECT EXISTS (SELECT 1 FROM crawl_jobs c WHERE c.state IN ('queued', 'listing', 'running')
                  AND {_TENANT_ON.format(col="c.tenant_id")}
                  AND (CAST(%(tenants)s AS text[]) IS NULL
                       OR c.tenant_id IN (SELECT t.id FROM tenants t
                                           WHERE t.name = ANY (CAST(%(tenants)s AS text[])))))
"""


def has_open_runs(conn: Connection, tenants: Sequence[str] | None = None) -> bool:
    return bool(conn.execute(_OPEN_RUNS, {"tenants": list(tenants) if tenants else None}).fetchone()[0])


# ---------------------------------------------------------------------------------------------
# Reading a job (kdbl-control crawl waits on it)
# ---------------------------------------------------------------------------------------------
# A finished run has its counts (finalize); an open or stopped one counts its items as finalize will, so
# what a crawl stopped halfway reports agrees with the progress it showed (it said "0 indexed" before).
_STATUS = f"""
SELECT j.id, j.source_id, j.state, j.attempts, j.last_error, j.listed, j.excluded, j.unchanged, j.deleted,
       j.queued_files,
       CASE WHEN j.state = 'done' THEN j.indexed ELSE live.indexed END AS indexed,
       CASE WHEN j.state = 'done' THEN j.failed ELSE live.failed END AS failed,
       CASE WHEN j.state = 'done' THEN j.chunks ELSE live.chunks END AS chunks,
       CASE WHEN j.state = 'done' THEN j.bytes ELSE live.bytes END AS bytes,
       j.problems, live.pending,
       {_TENANT_ON.format(col="j.tenant_id")} AS tenant_enabled
  FROM crawl_jobs j
  CROSS JOIN LATERAL (
      SELECT count(*) FILTER (WHERE i.state IN ('queued', 'running')) AS pending,
             count(*) FILTER (WHERE i.state = 'done' AND j.state <> 'done') AS indexed,
             count(*) FILTER (WHERE (i.state = 'failed' OR i.file_status = 'failed') AND j.state <> 'done') AS failed,
             coalesce(sum(i.chunk_count) FILTER (WHERE i.state = 'done' AND j.state <> 'done'), 0) AS chunks,
             CAST(coalesce(sum(i.size) FILTER (WHERE i.state = 'done' AND j.state <> 'done'), 0) AS bigint) AS bytes
        FROM crawl_items i WHERE i.job_id = j.id
         AND (j.state <> 'done' OR i.state IN ('queued', 'running'))) live
 WHERE j.id = ANY (CAST(%(ids)s AS bigint[]))
"""


def job_status(conn: Connection, job_ids: Sequence[int]) -> dict[int, JobStatus]:
    rows = conn.execute(_STATUS, {"ids": list(job_ids)}).fetchall()
    return {r.id: JobStatus(r.id, r.source_id, r.state, r.attempts, r.last_error, r.listed, r.excluded,
                            r.unchanged, r.deleted, r.queued_files, r.indexed, r.failed, r.chunks, r.bytes,
                            [tuple(p) for p in r.problems], r.pending, r.tenant_enabled) for r in rows}
