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
# SKIP LOCKED: several workers embed disjoint batches.
_PENDING = """
SELECT c.id, f.key, f.title, c.context_header, c.text
  FROM chunks c
  JOIN files f ON f.id = c.file_id
  JOIN sources s ON s.id = c.source_id
  JOIN tenants t ON t.id = c.tenant_id
 WHERE c.tenant_id = kdbl_tenant() AND s.hybrid_enabled AND t.hybrid_enabled AND s.enabled
   AND (c.embedding IS NULL OR c.embedding_model IS DISTINCT FROM %(model)s)
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

Conn = psycopg.Connection[Any]


def tenants_with_hybrid(conn: Conn) -> list[uuid.UUID]:
    return [row[0] for row in conn.execute(_TENANTS_WITH_WORK)]


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
