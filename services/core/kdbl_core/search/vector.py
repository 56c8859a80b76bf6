"""The semantic arm: approximate nearest neighbours over chunk embeddings (pgvector HNSW, cosine).

Runs in the caller's RLS transaction, so only visible chunks come back. Filters and RLS drop rows after
the index produced them; pgvector's iterative index scan keeps reading the graph until `limit` rows
survive (relaxed order; the outer query re-sorts by exact distance). Only vectors of the current model
are compared, and only for sources (and tenants) with hybrid enabled. Vectors are stored as `halfvec`
(migration 0020): the query vector is cast to `halfvec(D)`, as the HNSW index's expression needs, and the
rerank's exact cosines are computed the same way, so both agree to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgvector import Vector

from kdbl_core.db.async_pool import Connection
from kdbl_core.search.duplicates import TEXT_KEY, TextKey
from kdbl_core.search.lexical import ChunkHit, Filters, filters_sql, hits, source_filter_sql

MAX_DIM = 4000  # halfvec's HNSW limit (migration 0020)

# Chunks and chunks with a vector of the model, over the searched sources the caller sees whole (the
# per-source counters, kdbl_core.content.vectors; a source seen through per-file grants is not counted).
_SHARE = """
SELECT coalesce(sum(st.chunks) FILTER (WHERE st.model = ''), 0)::bigint AS total,
       coalesce(sum(st.chunks) FILTER (WHERE st.model = %(model)s), 0)::bigint AS embedded
  FROM source_stats st
 WHERE st.tenant_id = kdbl_tenant() AND st.model IN ('', %(model)s){extra}
"""


def build_query(dim: int, filters: Filters, *, text_keys: bool = False) -> tuple[str, dict]:
    """The arm's statement; `text_keys`: each hit's text key and page too (duplicates.TEXT_KEY), computed
    for the `limit` rows only (a probe of each by id after the LIMIT)."""
    if not 0 < dim <= MAX_DIM:
        raise ValueError("bad embedding dimension")
    params: dict = {}
    extra = filters_sql(filters, params, "c")
    keyed = ("", "") if not text_keys else (
        ", k.text_key, k.page_no",
        f"\n  CROSS JOIN LATERAL (SELECT {TEXT_KEY.format(c='c')} AS text_key, c.page_no FROM chunks c "
        "WHERE c.id = nn.chunk_id OFFSET 0) k")
    sql = f"""
WITH nn AS (
    SELECT c.id AS chunk_id, c.file_id, c.source_id, c.seq,
           c.embedding::halfvec({dim}) <=> CAST(%(q)s AS halfvec({dim})) AS distance
      FROM chunks c
     WHERE c.tenant_id = kdbl_tenant() AND vector_dims(c.embedding) = {dim} AND c.embedding_model = %(model)s
       AND c.source_id IN (SELECT s.id FROM sources s JOIN tenants t ON t.id = s.tenant_id
                            WHERE s.hybrid_enabled AND t.hybrid_enabled){extra}
     ORDER BY c.embedding::halfvec({dim}) <=> CAST(%(q)s AS halfvec({dim}))
     LIMIT %(limit)s
)
SELECT nn.chunk_id, nn.file_id, nn.source_id, f.key, nn.seq, 1 - nn.distance AS score{keyed[0]}
  FROM nn JOIN files f ON f.id = nn.file_id{keyed[1]}
 ORDER BY nn.distance, nn.chunk_id
"""
    return sql, params


async def search(conn: Connection, query_vector: Sequence[float], model_id: str, filters: Filters, *,
                 limit: int, tuned: bool = False, keys: dict[int, TextKey] | None = None) -> list[ChunkHit]:
    """Nearest `limit` chunks. `tuned`: the caller already set this transaction's hnsw.ef_search
    (2 x limit, 64..1000) and iterative scan, as the search pipeline's preflight does (a round trip less).
    `keys`: filled with each hit's text key (kdbl_core.search.duplicates), in the same statement."""
    dim = len(query_vector)
    if not tuned:
        await conn.execute("SELECT set_config('hnsw.ef_search', %(ef)s, true), "
                           "set_config('hnsw.iterative_scan', 'relaxed_order', true)",
                           {"ef": str(min(1000, max(64, 2 * limit)))})
    sql, params = build_query(dim, filters, text_keys=keys is not None)
    params.update({"q": Vector(query_vector), "model": model_id, "limit": limit})
    rows = await (await conn.execute(sql, params)).fetchall()
    if keys is not None:
        keys.update((r.chunk_id, TextKey(r.text_key, r.page_no)) for r in rows)
    return hits(rows)


async def similarities(conn: Connection, query_vector: Sequence[float], model_id: str,
                       chunk_ids: list[int], *, keys: dict[int, TextKey] | None = None) -> dict[int, float]:
    """Exact cosine similarity of each given chunk's embedding (of `model_id`) to the query; a chunk
    without one is left out. `keys`: filled with every given chunk's text key, in the same statement."""
    if not chunk_ids:
        return {}
    dim = len(query_vector)
    if not 0 < dim <= MAX_DIM:
        raise ValueError("bad embedding dimension")
    keyed = f", {TEXT_KEY.format(c='c')} AS text_key, c.page_no" if keys is not None else ""
    cur = await conn.execute(f"""
        SELECT c.id, CASE WHEN c.embedding_model = %(model)s AND vector_dims(c.embedding) = {dim}
                          THEN 1 - (c.embedding::halfvec({dim}) <=> CAST(%(q)s AS halfvec({dim}))) END AS score{keyed}
          FROM chunks c
         WHERE c.id = ANY(CAST(%(ids)s AS bigint[])){"" if keys is not None else " AND c.embedding_model = %(model)s"}
    """, {"q": Vector(query_vector), "ids": chunk_ids, "model": model_id})
    rows = await cur.fetchall()
    if keys is not None:
        keys.update((r.id, TextKey(r.text_key, r.page_no)) for r in rows)
    return {r.id: float(r.score) for r in rows if r.score is not None}


async def embedded_share(conn: Connection, model_id: str, filters: Filters) -> tuple[int, int]:
    """(chunks with a vector of `model_id`, chunks) in the searched sources the caller sees whole."""
    params: dict = {"model": model_id}
    cur = await conn.execute(_SHARE.format(extra=source_filter_sql(filters, params, "st")), params)
    row = await cur.fetchone()
    return (int(row.embedded), int(row.total)) if row else (0, 0)
