"""The semantic arm: approximate nearest neighbours over chunk embeddings (pgvector HNSW, cosine).

Runs in the caller's RLS transaction, so only visible chunks come back. Filters and RLS drop rows after
the index produced them; pgvector's iterative index scan keeps reading the graph until `limit` rows
survive (relaxed order; the outer query re-sorts by exact distance). Only vectors of the current model
are compared, and only for sources (and tenants) with hybrid enabled.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgvector import Vector

from kdbl_core.db.async_pool import Connection
from kdbl_core.search.lexical import ChunkHit, Filters, filters_sql, hits


def build_query(dim: int, filters: Filters) -> tuple[str, dict]:
    if not 0 < dim <= 16000:
        raise ValueError("bad embedding dimension")
    params: dict = {}
    extra = filters_sql(filters, params, "c")
    sql = f"""
WITH nn AS (
    SELECT c.id AS chunk_id, c.file_id, c.source_id, c.seq,
           c.embedding::vector({dim}) <=> CAST(%(q)s AS vector({dim})) AS distance
      FROM chunks c
     WHERE c.tenant_id = kdbl_tenant() AND vector_dims(c.embedding) = {dim} AND c.embedding_model = %(model)s
       AND c.source_id IN (SELECT s.id FROM sources s JOIN tenants t ON t.id = s.tenant_id
                            WHERE s.hybrid_enabled AND t.hybrid_enabled){extra}
     ORDER BY c.embedding::vector({dim}) <=> CAST(%(q)s AS vector({dim}))
     LIMIT %(limit)s
)
SELECT nn.chunk_id, nn.file_id, nn.source_id, f.key, nn.seq, 1 - nn.distance AS score
  FROM nn JOIN files f ON f.id = nn.file_id
 ORDER BY nn.distance, nn.chunk_id
"""
    return sql, params


async def search(conn: Connection, query_vector: Sequence[float], model_id: str, filters: Filters, *,
                 limit: int, tuned: bool = False) -> list[ChunkHit]:
    """Nearest `limit` chunks. `tuned`: the caller already set this transaction's hnsw.ef_search
    (2 x limit, 64..1000) and iterative scan, as the search pipeline's preflight does (a round trip less)."""
    dim = len(query_vector)
    if not tuned:
        await conn.execute("SELECT set_config('hnsw.ef_search', %(ef)s, true), "
                           "set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                           {"ef": str(min(1000, max(64, 2 * limit)))})
    sql, params = build_query(dim, filters)
    params.update({"q": Vector(query_vector), "model": model_id, "limit": limit})
    rows = await (await conn.execute(sql, params)).fetchall()
    return hits(rows)


async def similarities(conn: Connection, query_vector: Sequence[float], model_id: str,
                       chunk_ids: list[int]) -> dict[int, float]:
    """Exact cosine similarity of each given chunk's embedding (of `model_id`) to the query."""
    if not chunk_ids:
        return {}
    dim = len(query_vector)
    if not 0 < dim <= 16000:
        raise ValueError("bad embedding dimension")
    cur = await conn.execute(f"""
        SELECT c.id, 1 - (c.embedding::vector({dim}) <=> CAST(%(q)s AS vector({dim}))) AS score
          FROM chunks c
         WHERE c.id = ANY(CAST(%(ids)s AS bigint[])) AND c.embedding_model = %(model)s AND vector_dims(c.embedding) = {dim}
    """, {"q": Vector(query_vector), "ids": chunk_ids, "model": model_id})
    return {r.id: float(r.score) for r in await cur.fetchall()}
