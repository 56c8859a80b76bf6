"""Search mode `graph` and hits' `rationale` (issue 31): the named entities of a query seed candidates, and
each hit can say why it matched.

The query's entities: every run of one to MAX_WINDOW words of the query is a candidate name, by its canonical
key (kdbl_core.content.entities.canonical_key: "acme corp" meets the entity "Acme Corporation"), plus the
dates and amounts the extractor finds in it; the search's preflight looks the keys up among the entities the
caller can read (one array in the statement it runs anyway: kdbl_core.search.pipeline), and `chosen` keeps
the longest non-overlapping names ("Bank of America" rather than "America"). Lower-case queries work: the
keys, not the capitals, decide.

The entity arm (`search`): the chunks naming the query's named entities (people, organisations, places,
products, events), ranked by how many of the query's entities — dates and amounts included — each names,
then by how often. Each seed's SAMPLE_CHUNKS most recent chunks are looked at (the index's order: a name
in 30,000 chunks would otherwise be read whole every search); the keyword arm, fused with this one by the
pipeline, finds the rest. Dates and amounts only rank: "2023" alone would seed thousands of chunks.

Everything runs in the caller's row-level-security transaction: an entity named only in files it cannot
read is no key match, and no hidden chunk is a candidate (migration 0025).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from kdbl_core.content import analysis
from kdbl_core.content.entities import canonical_key, extract, is_plain_word
from kdbl_core.db.async_pool import Connection
from kdbl_core.search.lexical import ChunkHit, Filters, filters_sql, hits

MAX_WINDOW = 5  # words in one candidate name
MAX_KEYS = 400  # candidate keys of one query (a query of 2,000 characters has ~1,500 windows)
SAMPLE_CHUNKS = 2000  # chunks looked at per seed entity
NAMED = frozenset({"PERSON", "ORG", "PLACE", "PRODUCT", "EVENT"})

_WORD = re.compile(r"[\w][\w&'’.\-]*")


@dataclass(frozen=True, slots=True)
class Window:
    start: int
    end: int
    key: str


@dataclass(frozen=True, slots=True)
class QueryEntity:
    id: int
    type: str
    name: str
    start: int  # where the query names it
    end: int


@lru_cache(maxsize=512)  # a search reads them up to three times (the preflight's statement, its row, the mode)
def windows(query: str) -> tuple[Window, ...]:
    """The query's candidate names: word runs of 1..MAX_WINDOW words (neither starting nor ending with a stop
    word), and
    the dates and amounts the extractor finds, each with its canonical key; the first MAX_KEYS distinct keys."""
    words = list(_WORD.finditer(query))
    found: list[Window] = [Window(m.start, m.end, m.key) for m in extract(query) if m.type in ("DATE", "MONEY")]
    for i in range(len(words)):
        if is_plain_word(words[i].group()):
            continue  # no name starts with "what", "in" or "the" (canonical keys drop a leading "the")
        for j in range(i, min(i + MAX_WINDOW, len(words))):
            if is_plain_word(words[j].group()):
                continue  # nor ends with one ("of" inside is fine: "Bank of America")
            key = canonical_key(query[words[i].start():words[j].end()])
            if key:
                found.append(Window(words[i].start(), words[j].end(), key))
    seen: set[str] = set()
    out = []
    for w in found:
        if w.key not in seen:
            if len(seen) == MAX_KEYS:
                continue
            seen.add(w.key)
        out.append(w)
    return tuple(out)


def keys(found: Sequence[Window]) -> list[str]:
    return sorted({w.key for w in found})


def chosen(found: Sequence[Window], rows: Sequence[Sequence]) -> list[QueryEntity]:
    """The query's entities: of the windows whose key names a readable entity (`rows`: [id, type, key, name],
    the preflight's), the longest first, none overlapping one taken; every type of a name taken."""
    by_key: dict[str, list[Sequence]] = {}
    for row in rows:
        by_key.setdefault(str(row[2]), []).append(row)
    taken: list[QueryEntity] = []
    spans: list[tuple[int, int]] = []
    for w in sorted(found, key=lambda w: (-(w.end - w.start), w.start)):
        if w.key not in by_key or any(w.start < e and s < w.end for s, e in spans):
            continue
        spans.append((w.start, w.end))
        taken.extend(QueryEntity(int(r[0]), str(r[1]), str(r[3]), w.start, w.end) for r in by_key[w.key])
    return sorted(taken, key=lambda e: (e.start, e.type))


def seeds(entities: Sequence[QueryEntity]) -> list[int]:
    """The named entities' ids (people, organisations, places, products, events), each once."""
    return list(dict.fromkeys(e.id for e in entities if e.type in NAMED))


def _statement(filters: Filters, params: dict) -> str:
    extra = filters_sql(filters, params, "m")
    # the seeds' sampled chunks, counted per chunk (how many seeds each names: no join), plus the query's other
    # entities (dates, amounts) each names, probed only when the query has any
    return f"""
WITH seeds AS (SELECT unnest(CAST(%(seeds)s AS bigint[])) AS e),
cand AS MATERIALIZED (
    SELECT x.file_id, x.seq, x.n FROM seeds CROSS JOIN LATERAL (
        SELECT m.file_id, m.seq, m.n FROM entity_mentions m
         WHERE m.entity_id = seeds.e AND m.seq >= 0{extra}
         ORDER BY m.file_id DESC, m.seq LIMIT %(sample)s) x
), scored AS MATERIALIZED (
    SELECT g.file_id, g.seq, g.seeds + CASE WHEN cardinality(CAST(%(others)s AS bigint[])) = 0 THEN 0 ELSE
               (SELECT count(*) FROM entity_mentions o WHERE o.file_id = g.file_id AND o.seq = g.seq
                   AND o.entity_id = ANY (CAST(%(others)s AS bigint[]))) END AS matched, g.n
      FROM (SELECT file_id, seq, count(*) AS seeds, sum(n) AS n FROM cand GROUP BY file_id, seq) g
     ORDER BY matched DESC, g.n DESC, g.file_id DESC, g.seq LIMIT %(limit)s
)
SELECT c.id AS chunk_id, s.file_id, c.source_id, f.key, s.seq, CAST(s.matched AS float8) AS score
  FROM scored s  -- each chunk and file by its key (a join planned as a hash read every file: 8 ms at 10k files)
  CROSS JOIN LATERAL (SELECT c.id, c.source_id FROM chunks c WHERE c.file_id = s.file_id AND c.seq = s.seq OFFSET 0) c
  CROSS JOIN LATERAL (SELECT f.key FROM files f WHERE f.id = s.file_id OFFSET 0) f
 ORDER BY s.matched DESC, s.n DESC, s.file_id DESC, s.seq
"""


async def search(conn: Connection, entities: Sequence[QueryEntity], filters: Filters, *, limit: int) -> list[ChunkHit]:
    """The entity arm's top `limit` chunks (module docstring); score: the query's entities each names."""
    named = seeds(entities)
    if not named:
        return []
    others = sorted({e.id for e in entities} - set(named))
    params: dict = {"seeds": named, "others": others, "sample": SAMPLE_CHUNKS, "limit": limit}
    sql = _statement(filters, params)
    # planned for these seeds every time: a generic plan knows neither how often they are named nor how many
    return hits(await (await conn.execute(sql, params, prepare=False)).fetchall())


# -- rationale -------------------------------------------------------------------------------------------------

_WHY = f"""
WITH q AS (SELECT DISTINCT w.word, w.pos, t.term FROM unnest(CAST(%(words)s AS text[])) WITH ORDINALITY AS w(word, pos)
            CROSS JOIN LATERAL {analysis.TERMS.format(text="w.word")} AS t)
SELECT h.file_id, h.seq,
       ARRAY(SELECT q.word FROM q WHERE q.term = ANY ({analysis.chunk_term_array("c")})
              GROUP BY q.word ORDER BY min(q.pos)) AS words,
       ARRAY(SELECT m.entity_id FROM entity_mentions m
              WHERE m.file_id = h.file_id AND m.seq = h.seq AND m.entity_id = ANY (CAST(%(entities)s AS bigint[]))
              ORDER BY m.entity_id) AS entities
  FROM unnest(CAST(%(files)s AS bigint[]), CAST(%(seqs)s AS integer[])) AS h(file_id, seq)
  JOIN chunks c ON c.file_id = h.file_id AND c.seq = h.seq
"""


async def rationale(conn: Connection, query: str, entities: Sequence[QueryEntity], places: Sequence[tuple[int, int]],
                    *, ts_config: str) -> dict[tuple[int, int], tuple[list[str], list[QueryEntity]]]:
    """For each (file id, seq): the query's words it holds (as the keyword arm matches them: by their terms)
    and the query's entities it names; one statement for a page."""
    if not places:
        return {}
    words = list(dict.fromkeys(m.group().strip(".'’-") for m in _WORD.finditer(query)))
    by_id: dict[int, list[QueryEntity]] = {}
    for e in entities:
        by_id.setdefault(e.id, []).append(e)
    rows = await (await conn.execute(_WHY, {
        "cfg": ts_config, "words": [w for w in words if w], "entities": sorted(by_id),
        "files": [f for f, _ in places], "seqs": [s for _, s in places]})).fetchall()
    return {(r.file_id, r.seq): (list(r.words), [e for i in r.entities for e in by_id[i][:1]]) for r in rows}
