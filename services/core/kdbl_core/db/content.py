"""The write path of indexed content: one file's rows replaced atomically, BM25 statistics kept exact.

Callers run these inside `tenant_transaction` (the worker role sees one tenant at a time).
A file is written in one transaction: its old chunks, postings and statistics go out and the new
ones come in together, so a crash at any moment leaves either the old file or the new one.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, text

# Statistics counters are sharded by backend so concurrent writers rarely touch the same row.
_SHARD = "(pg_backend_pid() % 16)::smallint"


@dataclass(frozen=True, slots=True)
class FileMeta:
    key: str
    size: int | None = None
    mtime: datetime | None = None
    etag: str | None = None
    content_type: str | None = None
    storage_class: str | None = None
    owner: str | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None


@dataclass(frozen=True, slots=True)
class ChunkRow:
    seq: int
    text: str
    char_start: int
    char_end: int
    page_no: int | None = None
    ts_start_ms: int | None = None
    ts_end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class FileState:
    size: int | None
    mtime: datetime | None
    etag: str | None
    status: str


_UPSERT_FILE = text("""
INSERT INTO files (tenant_id, source_id, key, size, mtime, etag, content_type, storage_class, owner,
                   mode, uid, gid, status, status_reason, title, chunk_count, text_chars, indexed_at, seen_at)
VALUES (:tenant_id, :source_id, :key, :size, :mtime, :etag, :content_type, :storage_class, :owner,
        :mode, :uid, :gid, :status, :status_reason, :title, :chunk_count, :text_chars, now(), now())
ON CONFLICT (source_id, key) DO UPDATE SET
    size = EXCLUDED.size, mtime = EXCLUDED.mtime, etag = EXCLUDED.etag,
    content_type = EXCLUDED.content_type, storage_class = EXCLUDED.storage_class,
    owner = EXCLUDED.owner, mode = EXCLUDED.mode, uid = EXCLUDED.uid, gid = EXCLUDED.gid,
    status = EXCLUDED.status, status_reason = EXCLUDED.status_reason, title = EXCLUDED.title,
    chunk_count = EXCLUDED.chunk_count, text_chars = EXCLUDED.text_chars,
    indexed_at = now(), seen_at = now()
RETURNING id
""")

_OLD_SIZE = text(
    "SELECT count(*) AS n, coalesce(sum(token_count), 0) AS len FROM chunks WHERE file_id = ANY(:ids)"
)

_DROP_POSTINGS = text(f"""
WITH gone AS (DELETE FROM postings WHERE file_id = ANY(:ids) RETURNING term)
INSERT INTO term_stats (tenant_id, term, shard, df)
SELECT :tenant_id, term, {_SHARD}, -count(*) FROM gone GROUP BY term ORDER BY term
ON CONFLICT (tenant_id, term, shard) DO UPDATE SET df = term_stats.df + EXCLUDED.df
""")

_CORPUS_DELTA = text(f"""
INSERT INTO corpus_stats (tenant_id, shard, n_chunks, total_len)
VALUES (:tenant_id, {_SHARD}, :n, :len)
ON CONFLICT (tenant_id, shard) DO UPDATE SET
    n_chunks = corpus_stats.n_chunks + EXCLUDED.n_chunks,
    total_len = corpus_stats.total_len + EXCLUDED.total_len
""")

_INSERT_CHUNK = text("""
INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, page_no, char_start, char_end,
                    ts_start_ms, ts_end_ms)
VALUES (:tenant_id, :source_id, :file_id, :seq, :text, :page_no, :char_start, :char_end,
        :ts_start_ms, :ts_end_ms)
""")

# Tokenise in Postgres (the same text-search configuration the query side uses), write one
# posting per (term, chunk) with tf and the chunk length, and add the document frequencies.
_INDEX_FILE = text(f"""
WITH lex AS (
    SELECT c.id AS chunk_id, t.lexeme AS term, coalesce(array_length(t.positions, 1), 1) AS tf
      FROM chunks c, unnest(to_tsvector(CAST(:cfg AS regconfig), c.text)) AS t
     WHERE c.file_id = :file_id
), dl AS (
    SELECT chunk_id, sum(tf)::int AS dl FROM lex GROUP BY chunk_id
), upd AS (
    UPDATE chunks c SET token_count = dl.dl FROM dl WHERE c.id = dl.chunk_id RETURNING dl.dl
), ins AS (
    INSERT INTO postings (tenant_id, term, chunk_id, source_id, file_id, tf, dl)
    SELECT :tenant_id, lex.term, lex.chunk_id, :source_id, :file_id, least(lex.tf, 32767), dl.dl
      FROM lex JOIN dl USING (chunk_id)
    RETURNING term
), df AS (
    INSERT INTO term_stats (tenant_id, term, shard, df)
    SELECT :tenant_id, term, {_SHARD}, count(*) FROM ins GROUP BY term ORDER BY term
    ON CONFLICT (tenant_id, term, shard) DO UPDATE SET df = term_stats.df + EXCLUDED.df
)
SELECT coalesce(sum(dl), 0) FROM upd
""")


def load_file_states(conn: Connection, source_id: uuid.UUID) -> dict[str, FileState]:
    rows = conn.execute(
        text("SELECT key, size, mtime, etag, status FROM files WHERE source_id = :s"), {"s": source_id}
    )
    return {r.key: FileState(r.size, r.mtime, r.etag, r.status) for r in rows}


def _drop_content(conn: Connection, tenant_id: uuid.UUID, file_ids: Sequence[int]) -> None:
    old = conn.execute(_OLD_SIZE, {"ids": list(file_ids)}).one()
    if old.n == 0:
        return
    conn.execute(_DROP_POSTINGS, {"ids": list(file_ids), "tenant_id": tenant_id})
    conn.execute(_CORPUS_DELTA, {"tenant_id": tenant_id, "n": -old.n, "len": -old.len})
    conn.execute(text("DELETE FROM chunks WHERE file_id = ANY(:ids)"), {"ids": list(file_ids)})


def write_file(
    conn: Connection,
    *,
    tenant_id: uuid.UUID,
    source_id: uuid.UUID,
    meta: FileMeta,
    status: str,
    status_reason: str | None,
    title: str | None,
    chunks: Sequence[ChunkRow],
    text_chars: int,
    ts_config: str,
) -> int:
    """Replace one file's metadata, chunks and keyword index. Returns the file id."""
    file_id = conn.execute(_UPSERT_FILE, {
        "tenant_id": tenant_id, "source_id": source_id, "key": meta.key, "size": meta.size,
        "mtime": meta.mtime, "etag": meta.etag, "content_type": meta.content_type,
        "storage_class": meta.storage_class, "owner": meta.owner, "mode": meta.mode, "uid": meta.uid,
        "gid": meta.gid, "status": status, "status_reason": status_reason, "title": title,
        "chunk_count": len(chunks), "text_chars": text_chars,
    }).scalar_one()
    _drop_content(conn, tenant_id, [file_id])
    if chunks:
        conn.execute(_INSERT_CHUNK, [{
            "tenant_id": tenant_id, "source_id": source_id, "file_id": file_id, "seq": c.seq,
            "text": c.text, "page_no": c.page_no, "char_start": c.char_start, "char_end": c.char_end,
            "ts_start_ms": c.ts_start_ms, "ts_end_ms": c.ts_end_ms,
        } for c in chunks])
        total_len = conn.execute(_INDEX_FILE, {
            "cfg": ts_config, "file_id": file_id, "tenant_id": tenant_id, "source_id": source_id,
        }).scalar_one()
        conn.execute(_CORPUS_DELTA, {"tenant_id": tenant_id, "n": len(chunks), "len": total_len})
    return file_id


def delete_files(conn: Connection, tenant_id: uuid.UUID, source_id: uuid.UUID, keys: Iterable[str]) -> int:
    """Remove files (and their chunks, postings and statistics) that vanished from the source."""
    ids = list(conn.execute(
        text("SELECT id FROM files WHERE source_id = :s AND key = ANY(:keys)"),
        {"s": source_id, "keys": list(keys)},
    ).scalars())
    if not ids:
        return 0
    _drop_content(conn, tenant_id, ids)
    conn.execute(text("DELETE FROM files WHERE id = ANY(:ids)"), {"ids": ids})
    return len(ids)


def mark_source_indexed(conn: Connection, source_id: uuid.UUID) -> None:
    conn.execute(text("UPDATE sources SET last_indexed_at = now() WHERE id = :s"), {"s": source_id})
