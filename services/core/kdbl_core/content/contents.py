"""Many files and chunks read in one statement (get_contents), under the caller's row-level security.

A reference is a file (source_id, key) or a chunk of one (source_id, key, seq) with `neighbours` chunks
either side. One statement answers them all: each reference joins the files the principal sees, and a
LATERAL read takes its chunks (a chunk and its neighbours, or a file's first `FILE_CHUNKS` chunks). A
reference to something missing and one to something hidden come back alike (no row), so the caller
learns nothing about what it may not see; the answer is in the references' order.

Each item is cut to a character budget: a file's leading chunks while they fit; a chunk first, then its
neighbours nearest first while they fit (the chunk itself is cut when it alone is larger).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from kdbl_core.content.uris import MAX_SEQ
from kdbl_core.db.async_pool import Connection

FILE_CHUNKS = 500  # a file reference's chunks read at most (beyond: `truncated`, get_file_window reads on)

_READ = """
WITH ref AS (
    SELECT * FROM unnest(CAST(%(ord)s AS int[]), CAST(%(sid)s AS uuid[]), CAST(%(key)s AS text[]),
                         CAST(%(lo)s AS int[]), CAST(%(hi)s AS int[])) AS r(ord, source_id, key, lo, hi)
)
SELECT r.ord, f.source_id, f.key, f.title, f.content_type, f.status, f.chunk_count, f.mtime,
       c.seq, c.text, c.page_no, c.char_start, c.char_end, c.ts_start_ms, c.ts_end_ms
  FROM ref r
  JOIN files f ON f.tenant_id = kdbl_tenant() AND f.source_id = r.source_id AND f.key = r.key
  LEFT JOIN LATERAL (SELECT c.seq, c.text, c.page_no, c.char_start, c.char_end, c.ts_start_ms, c.ts_end_ms
                       FROM chunks c WHERE c.file_id = f.id AND c.seq BETWEEN r.lo AND r.hi
                      ORDER BY c.seq) c ON true
 ORDER BY r.ord, c.seq
"""

_CHUNK_FIELDS = ("seq", "text", "page_no", "char_start", "char_end", "ts_start_ms", "ts_end_ms")


@dataclass(frozen=True, slots=True)
class Ref:
    source_id: uuid.UUID
    key: str
    seq: int | None = None  # None: the whole file
    neighbours: int = 0


def _fit_file(chunks: list[dict[str, Any]], budget: int) -> tuple[list[dict[str, Any]], int | None]:
    """The leading chunks within `budget`, and the seq to read on from (None: nothing was cut)."""
    out: list[dict[str, Any]] = []
    used = 0
    for chunk in chunks:
        size = len(chunk["text"]) + (2 if out else 0)
        if used + size > budget:
            if not out:  # the first chunk alone is over the budget: its head, and read on from it
                out.append(dict(chunk, text=chunk["text"][:budget]))
                return out, chunk["seq"]
            return out, chunk["seq"]
        out.append(chunk)
        used += size
    return out, None


def _fit_chunk(chunks: list[dict[str, Any]], seq: int, budget: int) -> tuple[list[dict[str, Any]], bool]:
    by_seq = {c["seq"]: c for c in chunks}
    target = by_seq[seq]
    if len(target["text"]) > budget:
        return [dict(target, text=target["text"][:budget])], True
    kept, used, cut = {seq: target}, len(target["text"]), False
    for distance in range(1, len(chunks)):
        for s in (seq - distance, seq + distance):
            chunk = by_seq.get(s)
            if chunk is None:
                continue
            if used + len(chunk["text"]) + 2 > budget:
                cut = True
                continue
            kept[s] = chunk
            used += len(chunk["text"]) + 2
    return [kept[s] for s in sorted(kept)], cut


async def read(conn: Connection, refs: list[Ref], *, budget: int) -> list[dict[str, Any] | None]:
    """One entry per reference, in order: None when missing or not visible (alike), else the file's facts,
    `chunks` (within `budget` characters), `truncated` and, for a file, `next_start`."""
    if not refs:
        return []
    lo = [0 if r.seq is None else max(0, r.seq - r.neighbours) for r in refs]
    # the last chunk number a read may reach stays an int4 (uris.MAX_SEQ): a chunk id of 2**31 - 1 asks
    # for its neighbours past it
    hi = [FILE_CHUNKS - 1 if r.seq is None else min(r.seq + r.neighbours, MAX_SEQ) for r in refs]
    cur = await conn.execute(_READ, {"ord": list(range(len(refs))), "sid": [r.source_id for r in refs],
                                     "key": [r.key for r in refs], "lo": lo, "hi": hi})
    rows: dict[int, list[Any]] = {}
    for row in await cur.fetchall():
        rows.setdefault(row.ord, []).append(row)
    out: list[dict[str, Any] | None] = []
    for i, ref in enumerate(refs):
        found = rows.get(i)
        if not found:
            out.append(None)
            continue
        head = found[0]
        chunks = [{k: getattr(r, k) for k in _CHUNK_FIELDS} for r in found if r.seq is not None]
        if ref.seq is not None and all(c["seq"] != ref.seq for c in chunks):
            out.append(None)  # the file is there but has no such chunk: as missing
            continue
        item: dict[str, Any] = {"source_id": str(head.source_id), "key": head.key, "title": head.title,
                                "content_type": head.content_type, "status": head.status,
                                "total_chunks": head.chunk_count, "mtime": head.mtime}
        if ref.seq is None:
            fitted, read_on = _fit_file(chunks, budget)
            if read_on is None and head.chunk_count > len(chunks):  # more chunks than one read takes
                read_on = (fitted[-1]["seq"] + 1) if fitted else 0
            item.update(chunks=fitted, truncated=read_on is not None, next_start=read_on)
        else:
            fitted, cut = _fit_chunk(chunks, ref.seq, budget)
            item.update(chunks=fitted, truncated=cut, next_start=None)
        out.append(item)
    return out
