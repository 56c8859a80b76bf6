"""More like this (find_similar): the chunks or files nearest to a subject — a text, a stored chunk or a
stored file — in the caller's RLS transaction, the subject itself left out.

Two methods, and the result says which ran (`method`, with `method_reason` when it is not the vector one):

- vector: the subject's embedding — a chunk's stored vector, a file's mean over its embedded chunks
  (cosine ranking normalises it, so the mean is the centroid direction), or a text embedded by the API's
  model — through the vector arm (kdbl_core.search.vector: RLS, filters, hybrid toggles, pgvector's
  iterative scan). Used when the tenant's policy allows vectors ("hybrid" in mcp.modes) and the subject
  has a vector (a text needs the embedder).
- lexical: more-like-this through the BM25 arm: the subject's `terms_k` most distinctive terms
  (KDBL_SIMILAR_TERMS, default 25; tf x idf over what the principal sees:
  kdbl_core.search.lexical.distinctive_terms; a stored subject's from its own postings, a text's as a
  query is analysed) scored as one OR query (lexical.search_terms).
  Used otherwise, and when the vector arm finds nothing (sources without vectors).

`by: "files"` ranks files by their best chunk (the arms run `FILE_DEPTH` deep, then group). The subject is
left out: a file subject (and, by files, a chunk subject's file) in SQL inside each arm
(Filters.exclude_file_id), a chunk subject by dropping its row.
Measured on SciFact (docs/benchmarks.md, `kdbl-control bench similar`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import anyio.to_thread
import numpy as np

from kdbl_core.db.async_pool import Connection
from kdbl_core.embedder import Embedder
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import bm25_topk, lexical, vector
from kdbl_core.search.lexical import ChunkHit, Filters

MLT_TERMS = 25  # the default of Settings.similar_terms (KDBL_SIMILAR_TERMS)
FILE_DEPTH = 10  # chunk hits per wanted file before grouping (files with several matching chunks)
MAX_FILE_CHUNKS = 500  # a file subject: its first chunks (postings or vectors), a bound on a huge file's cost
NOT_VISIBLE = "not found (or not visible to you)"


@dataclass(frozen=True, slots=True)
class Subject:
    """What to find neighbours of: `text`, or a stored file (source_id, key) and, for a chunk, its seq."""

    kind: str  # text | chunk | file
    text: str | None = None
    source_id: Any = None
    key: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class Similar:
    hits: list[ChunkHit]  # by chunks: ranked chunks; by files: each file's best chunk, ranked
    method: str  # vector | lexical
    method_reason: str | None
    terms: list[str]  # the lexical method's terms (empty for vector)


_RESOLVE = """
SELECT f.id AS file_id, c.id AS chunk_id
  FROM files f
  LEFT JOIN chunks c ON c.file_id = f.id AND c.seq = %(seq)s
 WHERE f.tenant_id = kdbl_tenant() AND f.source_id = %(sid)s AND f.key = %(key)s
"""
_CHUNK_VECTOR = """
SELECT embedding, embedding_model FROM chunks WHERE id = %(id)s AND embedding IS NOT NULL
"""
_FILE_CHUNKS = """
SELECT id, embedding, embedding_model FROM chunks WHERE file_id = %(file)s ORDER BY seq LIMIT %(n)s
"""


async def _resolve(conn: Connection, subject: Subject) -> tuple[int, int | None]:
    """(file row id, chunk row id or None); InvalidArgument naming subject.id when the caller cannot see it
    (the same answer whether it does not exist or is hidden: no existence oracle)."""
    row = await (await conn.execute(_RESOLVE, {"sid": subject.source_id, "key": subject.key,
                                               "seq": subject.seq if subject.seq is not None else -1})).fetchone()
    if row is None or (subject.kind == "chunk" and row.chunk_id is None):
        raise InvalidArgument("subject.id", NOT_VISIBLE)
    return row.file_id, row.chunk_id


def _mean(vectors: list[Any]) -> list[float]:
    """The mean of pgvector Vectors (as the binary adapter returns them)."""
    return np.mean(np.stack([v.to_numpy() for v in vectors]), axis=0).astype(np.float32).tolist()


async def find(conn: Connection, subject: Subject, filters: Filters, *, by: str, limit: int, ts_config: str,
               vectors_allowed: bool, embedder: Embedder | None, exhaustive: bool = False, native: bool = True,
               terms_k: int = MLT_TERMS) -> Similar:
    """The `limit` nearest chunks (by="chunks") or files (by="files") to `subject`, excluding it."""
    file_id = chunk_id = None
    chunk_ids: list[int] = []
    if subject.kind != "text":
        file_id, chunk_id = await _resolve(conn, subject)
    if subject.kind == "file" or (subject.kind == "chunk" and by == "files"):
        filters = replace(filters, exclude_file_id=file_id)  # other files: never the subject's own
    rows: list[Any] = []
    if subject.kind == "file":
        rows = await (await conn.execute(_FILE_CHUNKS, {"file": file_id, "n": MAX_FILE_CHUNKS})).fetchall()
        chunk_ids = [r.id for r in rows]
    depth = limit * FILE_DEPTH if by == "files" else limit + 1  # +1: the chunk subject's own row

    # the subject's vector, when vectors may serve this tenant
    query_vector: list[float] | None = None
    model: str | None = None
    reason: str | None = None
    if not vectors_allowed:
        reason = "semantic search is not allowed for this tenant (policy: lexical only)"
    elif subject.kind == "text":
        if embedder is None:
            reason = "no embedder deployed"
        else:
            query_vector = await anyio.to_thread.run_sync(embedder.embed_query, subject.text)
            model = embedder.model_id
    elif subject.kind == "chunk":
        row = await (await conn.execute(_CHUNK_VECTOR, {"id": chunk_id})).fetchone()
        if row is not None:
            query_vector, model = row.embedding.to_list(), row.embedding_model
    else:
        embedded = [r for r in rows if r.embedding is not None]
        if embedded:
            model = max({r.embedding_model for r in embedded},
                        key=lambda m: sum(1 for r in embedded if r.embedding_model == m))
            query_vector = _mean([r.embedding for r in embedded if r.embedding_model == model])
    if vectors_allowed and subject.kind != "text" and query_vector is None:
        reason = "the subject has no stored embedding (its source is not hybrid)"

    hits: list[ChunkHit] = []
    terms: list[str] = []
    method = "vector"
    if query_vector is not None and model is not None:
        hits = await vector.search(conn, query_vector, model, filters, limit=depth)
        if not hits:
            reason = "no embedded chunks among the searched sources"
    if not hits:
        method = "lexical"
        if subject.kind == "text":
            terms = await lexical.distinctive_terms(conn, text=subject.text, ts_config=ts_config, k=terms_k)
        else:
            terms = await lexical.distinctive_terms(conn, chunk_ids=[chunk_id] if subject.kind == "chunk"
                                                    else chunk_ids, ts_config=ts_config, k=terms_k)
        if terms:
            hits = await bm25_topk.search_terms(conn, terms, filters, limit=depth, exhaustive=exhaustive,
                                                   native=native)
    hits = [h for h in hits if h.chunk_id != chunk_id]
    if by == "files":
        best: dict[int, ChunkHit] = {}
        for hit in hits:  # ranked: the first hit of a file is its best
            best.setdefault(hit.file_id, hit)
        hits = list(best.values())
    return Similar(hits=hits[:limit], method=method, method_reason=reason if method == "lexical" else None,
                   terms=terms)


_FACTS = """
SELECT c.id, c.seq, c.page_no, c.char_start, c.char_end, c.ts_start_ms, c.ts_end_ms, left(c.text, 400) AS head,
       f.title, f.content_type
  FROM chunks c JOIN files f ON f.id = c.file_id
 WHERE c.id = ANY (CAST(%(ids)s AS bigint[]))
"""


async def hit_facts(conn: Connection, hits: list[ChunkHit]) -> dict[int, Any]:
    """{chunk row id: its locators, head and its file's title and content type} (one statement)."""
    if not hits:
        return {}
    cur = await conn.execute(_FACTS, {"ids": [h.chunk_id for h in hits]})
    return {r.id: r for r in await cur.fetchall()}
