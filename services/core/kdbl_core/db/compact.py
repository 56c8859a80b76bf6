"""Rebuilding the keyword index's B-trees after a large crawl (`kdbl-control db compact`).

Since migration 0021 (issue 29) the packed lists are the keyword index and postings rows only the delta
of databases without kdbl_bm25 or of chunks written before an upgrade: `db compact` packs every tenant's
lists first (kdbl_core.content.bm25_lists.build_all, which deletes the packed postings rows), then
VACUUMs postings and the lists (their dead rows' space is reused; an emptied postings heap is truncated)
and rebuilds the B-trees below, which VACUUM never shrinks: after the upgrade of a 100k-chunk database
postings_pkey kept 9.7 KB a chunk of empty pages until rebuilt.

Postings arrive in term order within a file but in random order across the whole key space, so the
primary key's pages split half-and-half and settle ~2/3 full. Measured at 1M synthetic chunks (69M
postings, docs/benchmarks.md): `REINDEX` took postings_pkey from 9,028 to 6,071 MB (-33%; the database
from 21.1 to 18.2 KB per chunk) in 101 s, and the keyword arm got faster for it (MaxScore SQL p50 123 ->
89 ms, exhaustive 293 -> 200 ms: fewer pages per term). Later writes split pages again, so this is for
after an initial crawl or a large re-crawl, not a schedule.

`REINDEX ... CONCURRENTLY`: searches and crawls go on while it runs (it needs the index's size again in
free disk until it swaps). Progress comes from pg_stat_progress_create_index, polled from a second
connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from kdbl_core.db.connect import conninfo

INDEXES = ("postings_pkey", "postings_file_idx", "bm25_lists_pkey")
VACUUMED = "postings, bm25_lists, bm25_dead, chunks"
_PROGRESS = """
SELECT phase, blocks_done, blocks_total, tuples_done, tuples_total
  FROM pg_stat_progress_create_index WHERE pid = %(pid)s
"""
_SIZE = "SELECT pg_relation_size(to_regclass(%(name)s))"


def _watch(url: str, pid: int, name: str, done: threading.Event, log: Callable[[str], None],
           every_s: float) -> None:
    with psycopg.connect(conninfo(url), autocommit=True) as conn:
        while not done.wait(every_s):
            row = conn.execute(_PROGRESS, {"pid": pid}).fetchone()
            if row is None:
                continue
            phase, blocks_done, blocks_total, tuples_done, tuples_total = row
            share = (f"{blocks_done / blocks_total:.0%} of blocks" if blocks_total else
                     f"{tuples_done / tuples_total:.0%} of tuples" if tuples_total else "")
            log(f"compact: {name}: {phase} {share}".rstrip())


def compact(owner_url: str, *, log: Callable[[str], None], every_s: float = 5.0) -> list[dict[str, Any]]:
    """VACUUM (ANALYZE) the keyword tables, then REINDEX CONCURRENTLY each of INDEXES; their sizes before
    and after and the seconds taken."""
    report = []
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:  # CONCURRENTLY: no transaction
        pid = conn.info.backend_pid
        log(f"compact: VACUUM (ANALYZE) {VACUUMED}")
        conn.execute(f"VACUUM (ANALYZE) {VACUUMED}")
        for name in INDEXES:
            [before] = conn.execute(_SIZE, {"name": name}).fetchone()
            log(f"compact: rebuilding {name} ({before / 2**20:,.0f} MB)")
            done = threading.Event()
            watcher = threading.Thread(target=_watch, args=(owner_url, pid, name, done, log, every_s), daemon=True)
            watcher.start()
            start = time.monotonic()
            try:
                conn.execute(f"REINDEX INDEX CONCURRENTLY {name}")  # a constant of this module, never input
            finally:
                done.set()
                watcher.join()
            seconds = time.monotonic() - start
            [after] = conn.execute(_SIZE, {"name": name}).fetchone()
            log(f"compact: {name}: {before / 2**20:,.0f} -> {after / 2**20:,.0f} MB in {seconds:.1f} s")
            report.append({"index": name, "bytes_before": before, "bytes_after": after,
                           "seconds": round(seconds, 1)})
    return report
