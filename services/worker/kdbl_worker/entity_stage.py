"""The worker's background stage for named entities (issue 31): after the crawl, like embedding.

Files of sources with `entities: true` are read again from their stored chunks (nothing is fetched or
extracted from the source again), a batch of files per transaction, until none waits; a source switched off
has its mentions deleted (kdbl_core.content.entity_store). The crawl never waits for it: entity extraction
costs ~0.45 ms a 1,000-character chunk (docs/benchmarks.md), a third of a crawl's per-chunk budget, so it
runs behind the crawl on its own thread and connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import entity_store
from kdbl_core.db.connect import Pool

log = logging.getLogger(__name__)
POLL_SECONDS = 5.0
FILES_PER_BATCH = 32


def extract_pending(pool: Pool, *, stop: threading.Event | None = None, files_per_batch: int = FILES_PER_BATCH,
                    progress: Callable[[int], None] | None = None) -> int:
    """Extract the entities of every waiting file (or until `stop`); the number of files read. `progress` is
    told the running count after each batch."""
    with pool.connection() as conn:
        tenants = entity_store.tenants_with_sources(conn)
    done = mentions = 0
    started = time.perf_counter()
    for tenant, sources in tenants.items():
        with tenant_transaction(pool, tenant) as conn:
            forgotten = entity_store.forget_switched_off(conn, tenant)
        if forgotten:
            log.info("entities forgotten (switched off)", extra={"tenant_id": str(tenant), "files": forgotten})
        while sources and not (stop and stop.is_set()):
            with tenant_transaction(pool, tenant) as conn:
                files, written = entity_store.extract_batch(conn, tenant, sources, files_per_batch)
            if not files:
                break
            done, mentions = done + files, mentions + written
            if progress is not None:
                progress(done)
    if done:
        log.info("entities extracted", extra={"files": done, "mentions": mentions,
                                              "seconds": round(time.perf_counter() - started, 2)})
    return done


def loop(pool: Pool, stop: threading.Event) -> None:
    """extract_pending every POLL_SECONDS until `stop` (the worker's and `kdbl-control up`'s thread)."""
    while not stop.is_set():
        try:
            extract_pending(pool, stop=stop)
        except Exception:  # noqa: BLE001 - keep the worker crawling; retry on the next poll
            log.exception("entity extraction pass failed")
        stop.wait(POLL_SECONDS)
