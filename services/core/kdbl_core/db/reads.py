"""Read-side queries for the API; always run inside an RLS transaction (rls_transaction)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_FILE = text("""
SELECT f.id, f.source_id, f.key, f.size, f.mtime, f.etag, f.content_type, f.storage_class, f.owner,
       f.mode, f.uid, f.gid, f.status, f.status_reason, f.title, f.chunk_count, f.indexed_at
  FROM files f
 WHERE f.tenant_id = kdbl_tenant() AND f.source_id = :source_id AND f.key = :key
""")

_CHUNKS = text("""
SELECT seq, text, page_no, char_start, char_end, ts_start_ms, ts_end_ms
  FROM chunks WHERE file_id = :file_id AND seq >= :start
 ORDER BY seq LIMIT :limit
""")

_SOURCE = text("""
SELECT id, protocol, enabled, last_indexed_at FROM sources WHERE tenant_id = kdbl_tenant() AND id = :id
""")


async def get_file(conn: AsyncConnection, source_id: uuid.UUID, key: str) -> dict[str, Any] | None:
    row = (await conn.execute(_FILE, {"source_id": source_id, "key": key})).mappings().first()
    return dict(row) if row else None


async def file_chunks(conn: AsyncConnection, file_id: int, *, start: int = 0, limit: int) -> list[dict[str, Any]]:
    rows = await conn.execute(_CHUNKS, {"file_id": file_id, "start": start, "limit": limit})
    return [dict(r) for r in rows.mappings()]


async def get_source(conn: AsyncConnection, source_id: uuid.UUID) -> dict[str, Any] | None:
    row = (await conn.execute(_SOURCE, {"id": source_id})).mappings().first()
    return dict(row) if row else None
