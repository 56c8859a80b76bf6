"""Building a tenant's packed BM25 posting lists (migration 0017, the kdbl_bm25 extension).

One statement packs every posting of the tenant with chunk id <= `upto` into one list per (term,
source) (`kdbl_bm25_pack`, ~4 bytes a posting), replacing the old lists in the same transaction. The
keyword arm (kdbl_core.search.bm25_native) reads the lists, the postings written since (`chunk_id >
upto`) and leaves out the chunks deleted since (`bm25_dead`), so a search is exact whatever the lists' age;
building again only makes it read less.

Why `upto` is safe: every statement that inserts chunks holds advisory lock LOCK_KEY (shared, by a
trigger, to the end of its transaction). The build takes it exclusively, which waits for those
transactions to end, opens a REPEATABLE READ snapshot, reads `upto` = the tenant's largest chunk id and
lets the lock go. So every chunk id <= upto was committed before the snapshot (and is in it) or rolled
back; later writers get larger ids. Writers wait only for that instant, not for the build. Deletions
after the snapshot are recorded by the trigger (the bm25_built row exists before the snapshot) and stay
in bm25_dead, which the build clears only as far as its snapshot sees.

When to build (`due`): after a crawl run (the worker) when what was written or deleted since the last
build reaches REBUILD_SHARE of the lists (at least REBUILD_MIN chunks), and in `kdbl-control db compact`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from kdbl_core.db.connect import conninfo

LOCK_KEY = 7738418277376668213  # 'kdblbm25': the chunk writers' lock (sql/0017_bm25_lists.sql)
REBUILD_SHARE = 0.10
REBUILD_MIN = 2_000

_TENANT = ("SELECT set_config('kdbl.tenant_id', %(t)s, false) AS tenant, "
           "set_config('kdbl.subjects', '', false) AS subjects, hashtextextended('kdbl_bm25_build:' || %(t)s, 0) AS key")
_PACK = """
INSERT INTO bm25_lists (tenant_id, term, source_id, n, list)
SELECT p.tenant_id, p.term, p.source_id, count(*), kdbl_bm25_pack(p.chunk_id, p.tf, p.dl ORDER BY p.chunk_id)
  FROM postings p
 WHERE p.tenant_id = %(t)s AND p.chunk_id <= %(upto)s
 GROUP BY p.tenant_id, p.term, p.source_id
"""
_MARK = """
UPDATE bm25_built b SET upto = %(upto)s, chunks = s.chunks, lists = l.lists, postings = l.postings,
       bytes = l.bytes, seconds = %(seconds)s, built_at = now()
  FROM (SELECT coalesce(sum(n_chunks), 0) AS chunks FROM corpus_stats WHERE tenant_id = %(t)s) s,
       (SELECT count(*) AS lists, coalesce(sum(n), 0) AS postings, coalesce(sum(octet_length(list)), 0) AS bytes
          FROM bm25_lists WHERE tenant_id = %(t)s) l
 WHERE b.tenant_id = %(t)s
RETURNING b.upto, b.chunks, b.lists, b.postings, b.bytes
"""
_DUE = """
SELECT b.upto, b.chunks, s.chunks AS now_chunks, (SELECT count(*) FROM bm25_dead d WHERE d.tenant_id = %(t)s) AS dead
  FROM (SELECT coalesce(sum(n_chunks), 0) AS chunks FROM corpus_stats WHERE tenant_id = %(t)s) s
  LEFT JOIN bm25_built b ON b.tenant_id = %(t)s
"""


def extension_installed(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT to_regprocedure('kdbl_bm25_topk_final(internal)') IS NOT NULL").fetchone()[0]


def due(conn: psycopg.Connection, tenant_id: uuid.UUID) -> bool:
    """Whether the tenant's lists are worth building: the extension is there, and chunks written or
    deleted since the last build reach REBUILD_SHARE of those built (and REBUILD_MIN)."""
    if not extension_installed(conn):
        return False
    with conn.transaction():
        conn.execute(_TENANT.replace("false", "true"), {"t": str(tenant_id)})
        row = conn.execute(_DUE, {"t": tenant_id}).fetchone()
    if row is None:
        return False
    upto, built_chunks, now_chunks, dead = row
    built_chunks = built_chunks or 0
    changed = abs(now_chunks - built_chunks) + 2 * dead  # a re-indexed chunk: one dead, one new
    return changed >= max(REBUILD_MIN, REBUILD_SHARE * built_chunks)


def build(conn: psycopg.Connection, tenant_id: uuid.UUID) -> dict[str, Any]:
    """Pack the tenant's postings into lists (module docstring). `conn` must be outside a transaction;
    it is left in autocommit. Returns what was built, or {"skipped": reason}."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("bm25_lists.build needs a connection outside a transaction")
    conn.autocommit = True
    if not extension_installed(conn):
        return {"skipped": "the kdbl_bm25 extension is not installed in this database"}
    t = str(tenant_id)
    tenant_key = conn.execute(_TENANT, {"t": t}).fetchone()[2]
    if not conn.execute("SELECT pg_try_advisory_lock(%(k)s)", {"k": tenant_key}).fetchone()[0]:
        return {"skipped": "another build of this tenant's lists is running"}
    started = time.perf_counter()
    try:
        # Deletions are recorded from here on (the trigger needs this row), before the snapshot below.
        conn.execute("INSERT INTO bm25_built (tenant_id) VALUES (%(t)s) ON CONFLICT (tenant_id) DO NOTHING",
                     {"t": tenant_id})
        conn.execute("SELECT pg_advisory_lock(%(k)s)", {"k": LOCK_KEY})  # waits for chunk writers
        locked = True
        try:
            conn.autocommit = False
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            with conn.transaction():
                [upto] = conn.execute("SELECT coalesce(max(id), 0) FROM chunks WHERE tenant_id = %(t)s",
                                      {"t": tenant_id}).fetchone()
                conn.execute("SELECT pg_advisory_unlock(%(k)s)", {"k": LOCK_KEY})
                locked = False
                conn.execute("DELETE FROM bm25_lists WHERE tenant_id = %(t)s", {"t": tenant_id})
                conn.execute(_PACK, {"t": tenant_id, "upto": upto})
                conn.execute("DELETE FROM bm25_dead WHERE tenant_id = %(t)s", {"t": tenant_id})
                row = conn.execute(_MARK, {"t": tenant_id, "upto": upto,
                                           "seconds": round(time.perf_counter() - started, 3)}).fetchone()
        finally:
            conn.isolation_level = None
            conn.autocommit = True
            if locked:
                conn.execute("SELECT pg_advisory_unlock(%(k)s)", {"k": LOCK_KEY})
    finally:
        conn.execute("SELECT pg_advisory_unlock(%(k)s) AS unlocked, set_config('kdbl.tenant_id', '', false) AS tenant, "
                     "set_config('kdbl.subjects', '', false) AS subjects", {"k": tenant_key})
    upto, chunks, lists, postings, size = row
    return {"upto": upto, "chunks": chunks, "lists": lists, "postings": postings, "bytes": size,
            "seconds": round(time.perf_counter() - started, 2)}


def build_all(owner_url: str, *, log: Callable[[str], None], every_s: float = 10.0) -> list[dict[str, Any]]:
    """build() for every tenant that has chunks (`kdbl-control db compact`), with a progress line every
    `every_s` seconds while a tenant's lists are packed (~1 minute per 70M postings)."""
    report = []
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        tenants = [r[0] for r in conn.execute(
            "SELECT tenant_id FROM corpus_stats GROUP BY tenant_id HAVING sum(n_chunks) > 0 ORDER BY 1")]
        for tenant_id in tenants:
            log(f"compact: packing the keyword lists of tenant {tenant_id}")
            done = threading.Event()
            started = time.monotonic()

            def tick() -> None:
                while not done.wait(every_s):
                    log(f"compact: still packing the keyword lists of tenant {tenant_id} "
                        f"({time.monotonic() - started:.0f} s)")

            ticker = threading.Thread(target=tick, daemon=True)
            ticker.start()
            try:
                built = build(conn, tenant_id)
            finally:
                done.set()
                ticker.join()
            if "skipped" in built:
                log(f"compact: keyword lists of tenant {tenant_id} not packed: {built['skipped']}")
            else:
                log(f"compact: tenant {tenant_id}: {built['postings']:,} postings in {built['lists']:,} lists, "
                    f"{built['bytes'] / 2**20:,.1f} MB, in {built['seconds']:.1f} s")
            report.append({"tenant_id": str(tenant_id), **built})
    return report
