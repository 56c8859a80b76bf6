"""Embedding storage: pending chunks (worker), vectors written back, progress per source."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncConnection

# Chunks of hybrid-enabled sources (and tenants) whose embedding is missing or from another model.
# SKIP LOCKED: several workers embed disjoint batches.
_PENDING = text("""
SELECT c.id, c.text
  FROM chunks c
  JOIN sources s ON s.id = c.source_id
  JOIN tenants t ON t.id = c.tenant_id
 WHERE c.tenant_id = kdbl_tenant() AND s.hybrid_enabled AND t.hybrid_enabled AND s.enabled
   AND (c.embedding IS NULL OR c.embedding_model IS DISTINCT FROM :model)
 ORDER BY c.id
 LIMIT :limit
 FOR UPDATE OF c SKIP LOCKED
""")

_STORE = text("UPDATE chunks SET embedding = CAST(:v AS vector), embedding_model = :model WHERE id = :id")

_TENANTS_WITH_WORK = text("""
SELECT DISTINCT t.id FROM tenants t JOIN sources s ON s.tenant_id = t.id
 WHERE t.hybrid_enabled AND s.hybrid_enabled AND s.enabled
""")

# From the per-source counters (sources the caller sees whole); other sources count the visible chunks.
_SOURCE_PROGRESS = text("""
WITH counted AS (
    SELECT st.source_id, sum(st.chunks) FILTER (WHERE st.model = '') AS total,
           coalesce(sum(st.chunks) FILTER (WHERE st.model = :model), 0) AS embedded
      FROM source_stats st WHERE st.source_id = ANY(:ids) GROUP BY st.source_id
)
SELECT source_id, total::bigint, embedded::bigint FROM counted
UNION ALL
SELECT c.source_id, count(*), count(*) FILTER (WHERE c.embedding_model = :model)
  FROM chunks c
 WHERE c.tenant_id = kdbl_tenant() AND c.source_id = ANY(:ids)
   AND c.source_id NOT IN (SELECT source_id FROM counted)
 GROUP BY c.source_id
""")


def vector_literal(values: Sequence[float]) -> str:
    return "[" + ",".join(f"{v:.7g}" for v in values) + "]"


def tenants_with_hybrid(conn: Connection) -> list[uuid.UUID]:
    return list(conn.execute(_TENANTS_WITH_WORK).scalars())


def claim_pending(conn: Connection, model_id: str, limit: int) -> list[tuple[int, str]]:
    return [(r.id, r.text) for r in conn.execute(_PENDING, {"model": model_id, "limit": limit})]


def store(conn: Connection, model_id: str, rows: Sequence[tuple[int, Sequence[float]]]) -> None:
    conn.execute(_STORE, [{"id": cid, "v": vector_literal(vec), "model": model_id} for cid, vec in rows])


def ensure_vector_index(conn: Connection, dim: int) -> str:
    return conn.execute(text("SELECT kdbl_ensure_vector_index(:d)"), {"d": dim}).scalar_one()


async def source_progress(conn: AsyncConnection, source_ids: Sequence[uuid.UUID], model_id: str | None
                          ) -> dict[uuid.UUID, dict[str, int]]:
    if not source_ids:
        return {}
    rows = await conn.execute(_SOURCE_PROGRESS, {"ids": list(source_ids), "model": model_id or ""})
    return {r.source_id: {"embedded": r.embedded, "total": r.total} for r in rows}

