"""Building a tenant's packed BM25 posting lists (migrations 0017 and 0021, the kdbl_bm25 extension).

The lists are the keyword index (issue 29). A tenant's lists come in *generations*: one row per (term,
source, generation) packs that generation's postings (`kdbl_bm25_pack`, ~3.3 bytes a posting). Writers
pack their own chunks as a small generation numbered -(first chunk id) (kdbl_core.content.store); a
build packs from the terms on the chunks' rows (`chunks.terms`, `chunks.tfs`, migration 0021). A *full*
build packs every chunk with id <= `upto` into generation 0, replacing all lists; an *added* generation
packs only the chunks written since the last build, (previous upto, upto]. Either deletes the writers'
generations it covers and the postings rows of the chunks it packed (rows that databases without the
extension, or before migration 0021, wrote). The keyword arm (kdbl_core.search.bm25_native) reads every
generation's list of each query term, any postings rows written since (`chunk_id > upto`) and leaves out
the chunks deleted since the last full build (`bm25_dead`), so a search is exact whatever the lists' age;
building only makes it read fewer, larger lists.

Why `upto` is safe: every statement that inserts chunks holds advisory lock LOCK_KEY (shared, by a
trigger, to the end of its transaction). The build takes it exclusively, which waits for those
transactions to end, opens a REPEATABLE READ snapshot, reads `upto` = the tenant's largest chunk id and
lets the lock go. So every chunk id <= upto was committed before the snapshot (and is in it) or rolled
back; later writers get larger ids. Writers wait only for that instant, not for the build. Deletions
after the snapshot are recorded by the trigger (the bm25_built row exists before the snapshot) and stay
in bm25_dead, which a full build clears only as far as its snapshot sees.

When (`due`, after each crawl run in the worker and every 30 s during a long one): an added generation
once ADD_SHARE of the chunks (at least REBUILD_MIN) were written or deleted since the last build — at
1M chunks, 10,000 chunks' postings, packed in seconds, so searches never read many small generations —
or when postings rows of packed chunks are left (after migration 0021); a full build instead when there
is no generation yet, when MAX_GENERATIONS exist, or when the deletions since the last full build reach
FULL_DEAD_SHARE (they are read and left out on every search until then). A full build of 100k chunks
(7.2M postings) took 10 s. `kdbl-control db compact` and `bench scale` build in full.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import psycopg

from kdbl_core.content import analysis
from kdbl_core.db.connect import conninfo
from kdbl_core.settings import get_settings

LOCK_KEY = 7738418277376668213  # 'kdblbm25': the chunk writers' lock (sql/0017_bm25_lists.sql)
REBUILD_MIN = 2_000
ADD_SHARE = 0.01
MAX_GENERATIONS = 8
FULL_DEAD_SHARE = 0.10
Kind = Literal["full", "add"]

_TENANT = ("SELECT set_config('kdbl.tenant_id', %(t)s, false) AS tenant, "
           "set_config('kdbl.subjects', '', false) AS subjects, hashtextextended('kdbl_bm25_build:' || %(t)s, 0) AS key")
# Each chunk goes to its file's partition (migration 0024: the file's permission set, 0 for none); only the
# chunks of sources in 'source' mode look their file up.
_PACK = f"""
INSERT INTO bm25_lists (tenant_id, term, source_id, permission_set, gen, n, list)
SELECT c.tenant_id, t.term, c.source_id, c.permission_set, %(gen)s, count(*),
       kdbl_bm25_pack(c.id, CAST(t.tf AS integer), c.token_count ORDER BY c.id)
  FROM (SELECT c.*, CASE WHEN c.source_id = ANY (CAST(%(share)s AS uuid[]))
                         THEN coalesce((SELECT f.permission_set FROM files f WHERE f.id = c.file_id), 0)
                         ELSE 0 END AS permission_set
          FROM chunks c
         WHERE c.tenant_id = %(t)s AND c.id > %(after)s AND c.id <= %(upto)s) c
 CROSS JOIN LATERAL {analysis.chunk_terms("c")}
 WHERE (%(parts)s = 1 OR mod(hashtext(t.term) & 2147483647, %(parts)s) = %(part)s)
 GROUP BY c.tenant_id, t.term, c.source_id, c.permission_set
"""
_SHARE_SOURCES = "SELECT coalesce(array_agg(id), '{}') FROM sources WHERE tenant_id = %(t)s AND acl_mode = 'source'"
# The pack sorts every (term, chunk) posting it reads, spilling to temporary files: ~60 bytes a posting, so
# 720M postings (10M chunks) asked for more than 44 GB of disk and filled it. A pack over more postings
# than the setting bm25_build_part_postings (KDBL_BM25_BUILD_PART_POSTINGS, 40M: ~2.4 GB of temporary files)
# runs in parts, one hash partition of the terms each: every part reads all the chunks again and sorts
# 1/parts of the postings. PART_POSTINGS overrides the setting (tests).
PART_POSTINGS: int | None = None
_POSTINGS_UPPER = """
SELECT CAST(coalesce(sum(token_count), 0) AS bigint) FROM chunks
 WHERE tenant_id = %(t)s AND id > %(after)s AND id <= %(upto)s
"""


def _pack(conn: psycopg.Connection, tenant_id: uuid.UUID, gen: int, after: int, upto: int) -> int:
    """Pack the chunks in (after, upto] as generation `gen`, in as many term partitions as keep the sort's
    temporary files bounded (PART_POSTINGS); the number of parts."""
    params = {"t": tenant_id, "gen": gen, "after": after, "upto": upto}
    [params["share"]] = conn.execute(_SHARE_SOURCES, params).fetchone()
    [postings] = conn.execute(_POSTINGS_UPPER, params).fetchone()  # tokens >= distinct terms a chunk
    per_part = PART_POSTINGS or get_settings().bm25_build_part_postings
    parts = max(1, -(-int(postings) // per_part))
    for part in range(parts):
        conn.execute(_PACK, {**params, "parts": parts, "part": part})
    return parts
# The postings rows of the packed chunks, and the writers' own generations of them (gen = -(first chunk
# id), kdbl_core.content.store): the build's generation holds them now.
_PRUNE = "DELETE FROM postings WHERE tenant_id = %(t)s AND chunk_id <= %(upto)s"
_FOLD = "DELETE FROM bm25_lists WHERE tenant_id = %(t)s AND gen < 0 AND gen >= -%(upto)s"
_MARK = """
UPDATE bm25_built b SET upto = %(upto)s, gens = %(gens)s, chunks = s.chunks, dead = d.dead, lists = l.lists,
       postings = l.postings, bytes = l.bytes, seconds = %(seconds)s, built_at = now()
  FROM (SELECT CAST(coalesce(sum(n_chunks), 0) AS bigint) AS chunks FROM corpus_stats WHERE tenant_id = %(t)s) s,
       (SELECT count(*) AS dead FROM bm25_dead WHERE tenant_id = %(t)s) d,
       (SELECT count(*) AS lists, coalesce(sum(n), 0) AS postings, coalesce(sum(octet_length(list)), 0) AS bytes
          FROM bm25_lists WHERE tenant_id = %(t)s) l
 WHERE b.tenant_id = %(t)s
RETURNING b.upto, b.gens, b.chunks, b.lists, b.postings, b.bytes
"""
_DUE = """
SELECT b.upto, b.gens, b.chunks, b.dead, s.chunks AS now_chunks,
       (SELECT count(*) FROM bm25_dead d WHERE d.tenant_id = %(t)s) AS now_dead,
       EXISTS (SELECT 1 FROM postings p WHERE p.tenant_id = %(t)s AND p.chunk_id <= b.upto) AS unpruned
  FROM (SELECT CAST(coalesce(sum(n_chunks), 0) AS bigint) AS chunks FROM corpus_stats WHERE tenant_id = %(t)s) s
  LEFT JOIN bm25_built b ON b.tenant_id = %(t)s
"""


def extension_installed(conn: psycopg.Connection) -> bool:
    """Whether this database has the extension and this role may pack with it: EXECUTE is granted to
    kdbl_worker and kdbl_admin only (kdbl_core.db.pgext.GRANTS), so a role without it skips the build."""
    return conn.execute("SELECT coalesce(has_function_privilege(to_regprocedure("
                        "'kdbl_bm25_pack(bigint, integer, integer)'), 'EXECUTE'), false)").fetchone()[0]


def due(conn: psycopg.Connection, tenant_id: uuid.UUID) -> Kind | None:
    """Which build the tenant's lists need now, if any (module docstring)."""
    if not extension_installed(conn):
        return None
    with conn.transaction():
        conn.execute(_TENANT.replace("false", "true"), {"t": str(tenant_id)})
        row = conn.execute(_DUE, {"t": tenant_id}).fetchone()
    if row is None:
        return None
    upto, gens, built_chunks, built_dead, now_chunks, now_dead, unpruned = row
    gens, built_chunks, built_dead = gens or 0, built_chunks or 0, built_dead or 0
    # a re-indexed chunk: one dead, one new; the chunk count alone would not move
    changed = abs(now_chunks - built_chunks) + 2 * max(now_dead - built_dead, 0)
    if changed < max(REBUILD_MIN, ADD_SHARE * built_chunks) and not unpruned:
        return None  # (unpruned: postings rows of packed chunks, as migration 0021 leaves them)
    if not upto or gens == 0 or gens >= MAX_GENERATIONS or now_dead >= FULL_DEAD_SHARE * max(now_chunks, 1):
        return "full"
    return "add"


def build(conn: psycopg.Connection, tenant_id: uuid.UUID, kind: Kind = "full") -> dict[str, Any]:
    """Pack the tenant's postings (module docstring): `full` replaces every list, `add` packs the chunks
    written since the last build as one more generation (a full build when there is none yet). `conn` must
    be outside a transaction; it is left in autocommit. Returns what was built, or {"skipped": reason}."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError("bm25_lists.build needs a connection outside a transaction")
    conn.autocommit = True
    if not extension_installed(conn):
        return {"skipped": "the kdbl_bm25 extension is not installed in this database, or not granted to this role"}
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
                after, gens = conn.execute("SELECT upto, gens FROM bm25_built WHERE tenant_id = %(t)s",
                                           {"t": tenant_id}).fetchone()
                if kind == "add" and after > 0 and gens > 0:
                    parts = _pack(conn, tenant_id, gens, after, upto)
                    gens += 1
                else:
                    kind, after, gens = "full", 0, 1
                    conn.execute("DELETE FROM bm25_lists WHERE tenant_id = %(t)s", {"t": tenant_id})
                    parts = _pack(conn, tenant_id, 0, 0, upto)
                    conn.execute("DELETE FROM bm25_dead WHERE tenant_id = %(t)s", {"t": tenant_id})
                pruned = conn.execute(_PRUNE, {"t": tenant_id, "upto": upto}).rowcount
                conn.execute(_FOLD, {"t": tenant_id, "upto": upto})
                row = conn.execute(_MARK, {"t": tenant_id, "upto": upto, "gens": gens,
                                           "seconds": round(time.perf_counter() - started, 3)}).fetchone()
        finally:
            conn.isolation_level = None
            conn.autocommit = True
            if locked:
                conn.execute("SELECT pg_advisory_unlock(%(k)s)", {"k": LOCK_KEY})
    finally:
        conn.execute("SELECT pg_advisory_unlock(%(k)s) AS unlocked, set_config('kdbl.tenant_id', '', false) AS tenant, "
                     "set_config('kdbl.subjects', '', false) AS subjects", {"k": tenant_key})
    upto, gens, chunks, lists, postings, size = row
    return {"kind": kind, "upto": upto, "generations": gens, "chunks": chunks, "lists": lists,
            "postings": postings, "bytes": size, "postings_rows_pruned": pruned, "parts": parts,
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
