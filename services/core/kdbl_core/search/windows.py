"""Turn ranked chunk ids into answerable hits: the chunk plus neighbours, a <mark> snippet, locators;
and, for search_content's response modes, each hit's file facts (title, chunk count, type, mtime), the
head of its chunk, its heading path and token count, in one more statement the default shape never runs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from psycopg.rows import dict_row, tuple_row

from kdbl_core import pacing
from kdbl_core.content import analysis
from kdbl_core.db.async_pool import Connection
from kdbl_core.search.snippets import snippet

HIT_TEXT_BUDGET = 1800
YIELD_EVERY = 8  # hits assembled between two checkpoints (kdbl_core.pacing)

# The hits, their neighbours, and the query's lexemes (for the snippets, built in Python: snippets.py) on
# the first row only (an uncorrelated subquery runs once either way; on every row, each row's array was
# sent and parsed again). Plain tuples, read by position: dict rows cost a dict per row.
_NEIGHBOURS = """
WITH h AS (
    SELECT * FROM unnest(CAST(%(file_ids)s AS bigint[]), CAST(%(seqs)s AS int[])) AS h(file_id, seq)
)
SELECT {columns},
       CASE WHEN row_number() OVER () = 1 THEN (SELECT array_agg(DISTINCT t.term) FROM {terms} AS t) END AS lexemes
  FROM h JOIN chunks c ON c.file_id = h.file_id AND c.seq BETWEEN h.seq - 1 AND h.seq + 1
"""
# A window row's columns, in this order wherever one is read (here, and beside a lexical search's hits:
# kdbl_core.search.bm25_native), and their positions in it.
COLUMNS = ("file_id", "seq", "text", "page_no", "char_start", "char_end", "ts_start_ms", "ts_end_ms")
_FILE_ID, _SEQ, _TEXT, _PAGE, _CHAR_START, _CHAR_END, _TS_START, _TS_END, _LEXEMES = range(len(COLUMNS) + 1)
_NEIGHBOURS = _NEIGHBOURS.format(columns=", ".join(f"c.{column}" for column in COLUMNS),
                                 terms=analysis.TERMS.format(text="%(query)s"))


@dataclass(slots=True)
class Fetched:
    """Windows read ahead, with the hits that ranked them: the chunks at (file_id, seq) of each hit and its
    neighbours (rows in _NEIGHBOURS's column order), the hits they cover, and the query's lexemes."""

    rows: dict[tuple[int, int], tuple] = field(default_factory=dict)
    hits: set[tuple[int, int]] = field(default_factory=set)
    lexemes: frozenset[str] = frozenset()

    def covers(self, hits: list[HitRef]) -> bool:
        return bool(self.hits) and all((h.file_id, h.seq) in self.hits for h in hits)


# The file facts and chunk head of hits named by (source_id, key, seq), under the caller's RLS.
_HIT_FACTS = """
SELECT f.source_id, f.key, h.seq, f.title, f.chunk_count, f.content_type, f.mtime,
       left(c.text, %(head)s) AS head, c.context_header, c.text_tokens
  FROM unnest(CAST(%(sids)s AS uuid[]), CAST(%(keys)s AS text[]), CAST(%(seqs)s AS int[])) AS h(source_id, key, seq)
  JOIN files f ON f.source_id = h.source_id AND f.key = h.key
  LEFT JOIN chunks c ON c.file_id = f.id AND c.seq = h.seq
"""
HEAD_CHARS = 600  # enough for a ~200-character preview after whitespace folding


@dataclass(frozen=True, slots=True)
class HitFacts:
    title: str | None
    total_chunks: int
    content_type: str | None
    mtime: str | None  # ISO 8601
    head: str  # the chunk's first HEAD_CHARS characters
    context_header: str | None = None  # the heading path above the chunk (None: none, or indexed before 0015)
    token_count: int | None = None  # the chunk text's embedding-model tokens (None: indexed before 0015)


async def hit_facts(conn: Connection, hits: list[dict[str, Any]]) -> dict[tuple[str, str, int], HitFacts]:
    """{(source_id, key, seq): HitFacts} for hits as expand_hits returns them (one round trip)."""
    if not hits:
        return {}
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_HIT_FACTS, {
            "sids": [h["source_id"] for h in hits], "keys": [h["key"] for h in hits],
            "seqs": [h["seq"] for h in hits], "head": HEAD_CHARS,
        })
        rows = await cur.fetchall()
    return {(str(r["source_id"]), r["key"], r["seq"]): HitFacts(
        r["title"], r["chunk_count"] or 0, r["content_type"],
        r["mtime"].isoformat() if r["mtime"] is not None else None, r["head"] or "", r["context_header"],
        r["text_tokens"]) for r in rows}


@dataclass(frozen=True, slots=True)
class HitRef:
    file_id: int
    source_id: uuid.UUID
    key: str
    seq: int
    score: float


def _assemble(text: str, prev: str | None, nxt: str | None, budget: int) -> tuple[str, bool]:
    """Matched chunk first, then as much of the neighbours as fits: never more than `budget` characters.

    Each neighbour costs its text plus the newline that joins it (the newline was left out of the
    count, so a hit with only a previous neighbour came back at budget + 1 = 1,801 characters). When
    both do not fit, each gets half the room, and what one leaves unused goes to the other."""
    body = text[:budget]
    room = budget - len(body)
    need_prev = len(prev) + 1 if prev is not None else 0
    need_next = len(nxt) + 1 if nxt is not None else 0
    give_prev = min(need_prev, max(room // 2, room - need_next))
    give_next = min(need_next, room - give_prev)
    truncated = len(text) > budget or give_prev < need_prev or give_next < need_next
    before = after = ""
    if prev is not None and (give_prev >= 3 or give_prev == need_prev):  # 3: newline, ellipsis, one character
        before = _fit(prev, give_prev, keep_end=True) + "\n"
    if nxt is not None and (give_next >= 3 or give_next == need_next):
        after = "\n" + _fit(nxt, give_next, keep_end=False)
    return before + body + after, truncated


def _fit(text: str, room: int, *, keep_end: bool) -> str:
    """`text` in `room - 1` characters (one is the joining newline), cut with an ellipsis on the far side."""
    if len(text) < room:
        return text
    keep = room - 2  # the newline and the ellipsis
    return "…" + text[-keep:] if keep_end else text[:keep] + "…"


async def expand_hits(conn: Connection, hits: list[HitRef], *, query: str, ts_config: str,
                      budget: int = HIT_TEXT_BUDGET, fetched: Fetched | None = None) -> list[dict[str, Any]]:
    """The hits as answers: text window, snippet, locators. `fetched`: windows the ranking statement read
    already; used when they cover every hit (else, or without, one statement reads them)."""
    if not hits:
        return []
    if fetched is not None and fetched.covers(hits):
        return await _assembled(hits, fetched.rows, fetched.lexemes, ts_config, budget)
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(_NEIGHBOURS, {
            "file_ids": [h.file_id for h in hits], "seqs": [h.seq for h in hits],
            "cfg": ts_config, "query": query,
        })
        rows = await cur.fetchall()
    lexemes = frozenset(rows[0][_LEXEMES] or ()) if rows else frozenset()
    return await _assembled(hits, {(r[_FILE_ID], r[_SEQ]): r for r in rows}, lexemes, ts_config, budget)


async def _assembled(hits: list[HitRef], by_pos: dict[tuple[int, int], tuple], lexemes: frozenset[str],
                     ts_config: str, budget: int) -> list[dict[str, Any]]:
    out = []
    for i, h in enumerate(hits):
        if i and i % YIELD_EVERY == 0:
            await pacing.checkpoint()  # other calls may run between slices of a long result
        chunk = by_pos.get((h.file_id, h.seq))
        if chunk is None:  # vanished between ranking and hydration (re-index in flight)
            continue
        prev, nxt = by_pos.get((h.file_id, h.seq - 1)), by_pos.get((h.file_id, h.seq + 1))
        body, truncated = _assemble(chunk[_TEXT], prev[_TEXT] if prev is not None else None,
                                    nxt[_TEXT] if nxt is not None else None, budget)
        out.append({
            "source_id": str(h.source_id), "key": h.key, "seq": h.seq, "text": body,
            "truncated": truncated, "snippet": snippet(chunk[_TEXT], lexemes, ts_config),
            "page_no": chunk[_PAGE], "char_start": chunk[_CHAR_START], "char_end": chunk[_CHAR_END],
            "ts_start_ms": chunk[_TS_START], "ts_end_ms": chunk[_TS_END],
            "rank": round(h.score, 6),
        })
    return out
