"""Lexical first, embeddings after: fill chunk vectors for hybrid-enabled sources in batches.

Files become searchable by keyword the moment they are written; this stage runs behind the crawl and
never blocks it. Batches are claimed with SKIP LOCKED, so several workers share the work. A chunk whose
vector came from another model (e.g. a new model with another dimension) is re-embedded.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import vectors
from kdbl_core.db.connect import Pool
from kdbl_core.embedder import Embedder

log = logging.getLogger(__name__)
_indexed_dims: set[tuple[int, int]] = set()
_lock = threading.Lock()


def _ensure_index(pool: Pool, dim: int) -> None:
    key = (id(pool), dim)
    with _lock:
        if key in _indexed_dims:
            return
    with pool.connection() as conn:
        vectors.ensure_vector_index(conn, dim)
    with _lock:
        _indexed_dims.add(key)


HOLDER = f"{socket.gethostname()}:{os.getpid()}"  # this process, in embedding_rate


def embed_pending(pool: Pool, embedder: Embedder, *, tenant_id: uuid.UUID | None = None, batch: int = 32,
                  stop: threading.Event | None = None, max_batches: int | None = None,
                  progress: Callable[[int], None] | None = None) -> int:
    """Embed pending chunks until none are left (or `stop` is set). Returns how many were embedded.
    Each batch's rate goes to embedding_rate (the ETA of list_sources, /capacity and `up`); `progress`
    is told the running count after each batch."""
    _ensure_index(pool, embedder.dim)
    if tenant_id:
        tenants = [tenant_id]
    else:
        with pool.connection() as conn:
            tenants = vectors.tenants_with_hybrid(conn)
    done = batches = 0
    for tenant in tenants:
        while not (stop and stop.is_set()) and (max_batches is None or batches < max_batches):
            started = time.perf_counter()
            with tenant_transaction(pool, tenant) as conn:
                pending = vectors.claim_pending(conn, embedder.model_id, batch)
                if not pending:
                    break
                batch_vectors = embedder.embed([body for _, body in pending])
                vectors.store(conn, embedder.model_id, [(cid, vec) for (cid, _), vec in zip(pending, batch_vectors)])
                vectors.record_rate(conn, embedder.model_id, HOLDER, len(pending), time.perf_counter() - started)
            done += len(pending)
            batches += 1
            if progress is not None:
                progress(done)
            log.debug("embedded batch", extra={"tenant_id": str(tenant), "chunks": len(pending),
                                              "seconds": round(time.perf_counter() - started, 3)})
    if done:
        log.info("embeddings written", extra={"chunks": done, "model": embedder.model_id})
    return done
