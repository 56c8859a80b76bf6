"""Read-side queries for the API, on psycopg's AsyncConnection inside an RLS transaction
(kdbl_core.access.principal.rls_transaction); `server_key` alone reads outside one, on the pool."""

from __future__ import annotations

import uuid
from typing import Any

from kdbl_core.db.async_pool import AsyncPool, Connection

_FILE = """
SELECT f.id, f.source_id, f.key, f.size, f.mtime, f.etag, f.content_type, f.storage_class, f.owner,
       f.mode, f.uid, f.gid, f.status, f.status_reason, f.title, f.chunk_count, f.indexed_at, f.authors, f.labels
  FROM files f
 WHERE f.tenant_id = kdbl_tenant() AND f.source_id = %(source_id)s AND f.key = %(key)s
"""

_CHUNKS = """
SELECT seq, text, page_no, char_start, char_end, ts_start_ms, ts_end_ms
  FROM chunks WHERE file_id = %(file_id)s AND seq >= %(start)s
 ORDER BY seq LIMIT %(limit)s
"""

_SOURCE = """
SELECT id, protocol, enabled, last_indexed_at FROM sources WHERE tenant_id = kdbl_tenant() AND id = %(id)s
"""


async def get_file(conn: Connection, source_id: uuid.UUID, key: str) -> dict[str, Any] | None:
    row = await (await conn.execute(_FILE, {"source_id": source_id, "key": key})).fetchone()
    return row._asdict() if row else None


async def file_chunks(conn: Connection, file_id: int, *, start: int = 0, limit: int) -> list[dict[str, Any]]:
    cur = await conn.execute(_CHUNKS, {"file_id": file_id, "start": start, "limit": limit})
    return [r._asdict() for r in await cur.fetchall()]


async def get_source(conn: Connection, source_id: uuid.UUID) -> dict[str, Any] | None:
    row = await (await conn.execute(_SOURCE, {"id": source_id})).fetchone()
    return row._asdict() if row else None


_SOURCES = """
SELECT s.id, s.name, s.protocol, s.enabled, s.hybrid_enabled, s.last_indexed_at,
       -- the source's counters when the caller sees all of it, else a count of the files it may see
       coalesce((SELECT sum(st.files) FROM source_stats st WHERE st.source_id = s.id AND st.model = ''),
                (SELECT count(*) FROM files f WHERE f.source_id = s.id))::bigint AS file_count
  FROM sources s
 WHERE s.tenant_id = kdbl_tenant() AND (s.name, s.id) > (%(after_name)s, %(after_id)s)
 ORDER BY s.name, s.id LIMIT %(limit)s
"""

_FILES = """
SELECT f.source_id, f.key, f.size, f.mtime, f.content_type, f.status, f.chunk_count
  FROM files f
 WHERE f.tenant_id = kdbl_tenant() AND f.source_id = %(source_id)s AND f.key > %(after_key)s
 ORDER BY f.key LIMIT %(limit)s
"""

_ALL_FILES = """
SELECT f.source_id, f.key, f.size, f.content_type, f.title
  FROM files f
 WHERE f.tenant_id = kdbl_tenant() AND (f.source_id, f.key) > (%(after_source)s, %(after_key)s)
 ORDER BY f.source_id, f.key LIMIT %(limit)s
"""

_NIL = uuid.UUID(int=0)


async def list_sources(conn: Connection, *, after: tuple[str, uuid.UUID] | None, limit: int) -> list[dict]:
    name, sid = after or ("", _NIL)
    cur = await conn.execute(_SOURCES, {"after_name": name, "after_id": sid, "limit": limit})
    return [r._asdict() for r in await cur.fetchall()]


async def list_files(conn: Connection, source_id: uuid.UUID, *, after_key: str, limit: int) -> list[dict]:
    cur = await conn.execute(_FILES, {"source_id": source_id, "after_key": after_key, "limit": limit})
    return [r._asdict() for r in await cur.fetchall()]


async def list_all_files(conn: Connection, *, after: tuple[uuid.UUID, str] | None, limit: int) -> list[dict]:
    sid, key = after or (_NIL, "")
    cur = await conn.execute(_ALL_FILES, {"after_source": sid, "after_key": key, "limit": limit})
    return [r._asdict() for r in await cur.fetchall()]


_SOURCE_COUNTS = """
SELECT s.id AS source_id, s.name, count(f.id) AS files, coalesce(sum(f.chunk_count), 0) AS chunks
  FROM sources s LEFT JOIN files f ON f.tenant_id = kdbl_tenant() AND f.source_id = s.id
 WHERE s.tenant_id = kdbl_tenant()
 GROUP BY s.id, s.name ORDER BY s.name, s.id
"""

_SOURCE_CHUNKS = """
SELECT f.key, c.seq, f.title, f.content_type, c.page_no, length(c.text) AS chars
  FROM files f JOIN chunks c ON c.file_id = f.id
 WHERE f.tenant_id = kdbl_tenant() AND f.source_id = %(source_id)s AND (f.key, c.seq) > (%(key)s, %(seq)s)
 ORDER BY f.key, c.seq
 LIMIT %(limit)s
"""


async def source_resource_counts(conn: Connection) -> list[dict[str, Any]]:
    """Each visible source's visible files and chunks (resources/list reports them)."""
    return [r._asdict() for r in await (await conn.execute(_SOURCE_COUNTS)).fetchall()]


async def list_source_chunks(conn: Connection, source_id: uuid.UUID, *, after: tuple[str, int],
                             limit: int) -> list[dict[str, Any]]:
    """A source's chunks in (key, seq) order after `after` (("", -1): from the start)."""
    cur = await conn.execute(_SOURCE_CHUNKS, {"source_id": source_id, "key": after[0], "seq": after[1],
                                              "limit": limit})
    return [r._asdict() for r in await cur.fetchall()]


async def server_key(pool: AsyncPool, name: str) -> bytes:
    """A server-wide secret (the cursor key): one statement outside any tenant's transaction."""
    rows = await pool.fetch("SELECT secret FROM server_keys WHERE name = %(n)s", {"n": name})
    if not rows:
        raise LookupError(f"no server key {name!r}")
    return rows[0].secret
