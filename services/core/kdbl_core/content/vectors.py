"""Embedding storage: pending chunks (worker), vectors written back, progress per source.

The worker's functions run on a psycopg connection of a `connect.sync_pool` pool, whose pgvector
adapter sends the vectors in binary (`pgvector.Vector`: 4 bytes a dimension) instead of as formatted
text (~10 characters a dimension, parsed again by the server); the API's query vector goes binary too
(kdbl_core.search.vector).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from pgvector import Vector

from kdbl_core.content import analysis


# Chunks of hybrid-enabled sources (and tenants) whose embedding is missing or from another model.
_PENDING_CHUNKS = """
  FROM chunks c
  JOIN files f ON f.id = c.file_id
  JOIN sources s ON s.id = c.source_id
  JOIN tenants t ON t.id = c.tenant_id
 WHERE c.tenant_id = kdbl_tenant() AND s.hybrid_enabled AND t.hybrid_enabled AND s.enabled
   AND (c.embedding IS NULL OR c.embedding_model IS DISTINCT FROM %(model)s)"""
# SKIP LOCKED: several workers embed disjoint batches.
_PENDING = f"""
SELECT c.id, f.key, f.title, c.context_header, c.text{_PENDING_CHUNKS}
 ORDER BY c.id
 LIMIT %(limit)s
 FOR UPDATE OF c SKIP LOCKED
"""

_STORE = "UPDATE chunks SET embedding = %(v)s, embedding_model = %(model)s WHERE id = %(id)s"

_TENANTS_WITH_WORK = """
SELECT DISTINCT t.id FROM tenants t JOIN sources s ON s.tenant_id = t.id
 WHERE t.hybrid_enabled AND s.hybrid_enabled AND s.enabled
"""

# From the per-source counters (sources the caller sees whole); other sources count the visible chunks.
_SOURCE_PROGRESS = """
WITH counted AS (
    SELECT st.source_id, sum(st.chunks) FILTER (WHERE st.model = '') AS total,
           coalesce(sum(st.chunks) FILTER (WHERE st.model = %(model)s), 0) AS embedded
      FROM source_stats st WHERE st.source_id = ANY(%(ids)s) GROUP BY st.source_id
)
SELECT source_id, total::bigint, embedded::bigint FROM counted
UNION ALL
SELECT c.source_id, count(*), count(*) FILTER (WHERE c.embedding_model = %(model)s)
  FROM chunks c
 WHERE c.tenant_id = kdbl_tenant() AND c.source_id = ANY(%(ids)s)
   AND c.source_id NOT IN (SELECT source_id FROM counted)
 GROUP BY c.source_id
"""

# Each embedding process's rate (migration 0022): an exponential average over its batches, reset when
# the row is older than RATE_FRESH_S (the process paused); rows of a day ago are removed by the next writer.
RATE_FRESH_S = 120
RATE_WEIGHT = 0.2  # a new batch's share of the average
_RECORD_RATE = f"""
WITH gone AS (
    DELETE FROM embedding_rate WHERE tenant_id = kdbl_tenant() AND updated_at < now() - interval '1 day'
)
INSERT INTO embedding_rate AS r (tenant_id, model, holder, chunks_per_s)
VALUES (kdbl_tenant(), %(model)s, %(holder)s, %(rate)s)
ON CONFLICT (tenant_id, model, holder) DO UPDATE SET
    chunks_per_s = CASE WHEN r.updated_at > now() - interval '{RATE_FRESH_S} seconds'
                        THEN (1 - {RATE_WEIGHT}) * r.chunks_per_s + {RATE_WEIGHT} * EXCLUDED.chunks_per_s
                        ELSE EXCLUDED.chunks_per_s END,
    updated_at = now()
"""
# The summed rate of the tenant's live embedders of `model`.
_RATE = f"""
SELECT (SELECT coalesce(sum(chunks_per_s), 0) FROM embedding_rate
         WHERE tenant_id = kdbl_tenant() AND model = %(model)s
           AND updated_at > now() - interval '{RATE_FRESH_S} seconds') AS rate
"""

Conn = psycopg.Connection[Any]


def record_rate(conn: Conn, model_id: str, holder: str, chunks: int, seconds: float) -> None:
    """After a batch: fold its rate into this process's row (tenant: the transaction's, kdbl_tenant())."""
    if chunks and seconds > 0:
        conn.execute(_RECORD_RATE, {"model": model_id, "holder": holder, "rate": chunks / seconds})


async def embedding_rate(conn: psycopg.AsyncConnection[Any], model_id: str | None) -> float | None:
    """Chunks a second the tenant's embedders wrote recently (summed over processes); None when none
    embedded in the last RATE_FRESH_S seconds or no model is deployed."""
    if not model_id:
        return None
    cur = await conn.execute(_RATE, {"model": model_id})
    rate = float((await cur.fetchone())[0])
    return rate or None


def eta_s(pending: int, rate: float | None) -> float | None:
    """Seconds until `pending` chunks are embedded at `rate` (0 when none are pending; None: no rate)."""
    if pending <= 0:
        return 0.0
    return round(pending / rate, 1) if rate else None


# The sources whose chunks the embedders fill (claim_pending's), of the caller's tenant.
HYBRID_SOURCES = """
SELECT s.id FROM sources s JOIN tenants t ON t.id = s.tenant_id
 WHERE s.tenant_id = kdbl_tenant() AND s.hybrid_enabled AND t.hybrid_enabled AND s.enabled
"""


async def backlog(conn: psycopg.AsyncConnection[Any], model_id: str | None) -> dict[str, Any]:
    """The tenant's embedding progress as the caller sees it: chunks of hybrid sources, those embedded
    with `model_id`, the recent rate and the ETA of the rest (None without a rate or a model)."""
    ids = [row[0] for row in await (await conn.execute(HYBRID_SOURCES)).fetchall()]
    per_source = await source_progress(conn, ids, model_id)
    total = sum(p["total"] for p in per_source.values())
    embedded = sum(p["embedded"] for p in per_source.values()) if model_id else 0
    rate = await embedding_rate(conn, model_id)
    return {"hybrid_chunks": total, "embedded_chunks": embedded, "chunks_per_s": round(rate, 2) if rate else None,
            "eta_s": eta_s(total - embedded, rate) if model_id else None}


def tenants_with_hybrid(conn: Conn) -> list[uuid.UUID]:
    return [row[0] for row in conn.execute(_TENANTS_WITH_WORK)]


def count_pending(conn: Conn, model_id: str) -> int:
    """How many chunks claim_pending has left to hand out for `model_id` (the transaction's tenant)."""
    return conn.execute(f"SELECT count(*){_PENDING_CHUNKS}", {"model": model_id}).fetchone()[0]


def claim_pending(conn: Conn, model_id: str, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` chunks without a vector of `model_id`, locked, each with what to embed for it
    (analysis.embedding_text: its header, then its text)."""
    return [(r[0], analysis.embedding_text(r[1], r[2], r[3], r[4]))
            for r in conn.execute(_PENDING, {"model": model_id, "limit": limit})]


def store(conn: Conn, model_id: str, rows: Sequence[tuple[int, Sequence[float]]]) -> None:
    """Write a batch of vectors (binary, one pipelined round trip: psycopg's executemany)."""
    with conn.cursor() as cur:
        cur.executemany(_STORE, [{"id": cid, "v": Vector(list(vec)), "model": model_id} for cid, vec in rows])


def ensure_vector_index(conn: Conn, dim: int) -> str:
    row = conn.execute("SELECT kdbl_ensure_vector_index(%s)", (dim,)).fetchone()
    assert row is not None
    return row[0]


async def source_progress(conn: psycopg.AsyncConnection[Any], source_ids: Sequence[uuid.UUID],
                          model_id: str | None) -> dict[uuid.UUID, dict[str, int]]:
    """Embedded and total chunks per source, in the API's RLS transaction (access.principal.rls_transaction)."""
    if not source_ids:
        return {}
    cur = await conn.execute(_SOURCE_PROGRESS, {"ids": list(source_ids), "model": model_id or ""})
    return {r.source_id: {"embedded": r.embedded, "total": r.total} for r in await cur.fetchall()}
