"""The entity graph as the caller may see it (issue 31): an entity by name, what co-occurs with it, the chunks
it rests on. Every statement runs in the caller's row-level-security transaction: entities and mentions are
those of readable chunks (migration 0025), so an entity named only in hidden files is "not found" exactly as
an unknown name, and every count is a count of readable mentions.

Relationships: the typed relations sentences state (ACQUIRED, PARTNERS_WITH, COMPETES_WITH, LOCATED_IN,
WORKS_FOR: kdbl_core.content.entity_relations), and co-occurrences — two entities named in one chunk,
weighted by the chunks they share (`CO_OCCURS`); each with the chunks it rests on as evidence.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from kdbl_core.content.entities import TYPES, canonical_key
from kdbl_core.db.async_pool import Connection
from kdbl_core.errors import InvalidArgument

CO_OCCURS = "CO_OCCURS"
SUGGESTIONS = 5
# find_entity's response modes: (related entities, relationships, evidence chunks per relationship, top chunks)
CAPS = {"ids_only": (100, 500, 0, 0), "metadata": (0, 0, 0, 3), "preview": (5, 5, 3, 5), "full": (100, 500, 3, 10)}
# Related entities and co-occurrences are counted over an entity's SAMPLE_CHUNKS most recent chunks (the
# newest files first): a name in 30,000 chunks would otherwise join ~400,000 mentions per call. Its own
# mentions, chunks and files are always exact.
SAMPLE_CHUNKS = 1000


@dataclass(frozen=True, slots=True)
class Entity:
    id: int
    type: str
    key: str
    name: str


@dataclass(slots=True)
class Graph:
    """One entity's neighbourhood: related entities with the chunks shared, edges among them, statistics."""

    entity: Entity
    mentions: int = 0
    chunks: int = 0
    files: int = 0
    related: list[tuple[Entity, int]] = field(default_factory=list)  # (entity, chunks shared), best first
    related_total: int = 0
    sampled: int = 0  # the chunks related entities and co-occurrences were counted over
    related_types: dict[str, int] = field(default_factory=dict)
    edges: list[tuple[int, int, int]] = field(default_factory=list)  # (a, b, chunks shared), a < b
    evidence: dict[tuple[int, int], list[tuple[uuid.UUID, str, int]]] = field(default_factory=dict)
    # (subject, object, type, chunks stating it, up to 3 of them) with the entity on one side
    typed: list[tuple[int, int, str, int, list[tuple[uuid.UUID, str, int]]]] = field(default_factory=list)
    typed_types: dict[str, int] = field(default_factory=dict)
    top_chunks: list[dict[str, Any]] = field(default_factory=list)


_BY_KEY = """
SELECT e.id, e.type, e.key, e.name FROM entities e
 WHERE e.tenant_id = kdbl_tenant() AND e.key = %(key)s AND (%(type)s::text IS NULL OR e.type = %(type)s)
 ORDER BY e.type
"""
# names the caller can see that start like the one asked for (the key index serves the prefixes)
_SUGGEST = """
SELECT e.name, e.type FROM entities e
 WHERE e.tenant_id = kdbl_tenant() AND (e.key LIKE %(prefix)s OR e.key LIKE %(word)s)
 ORDER BY length(e.key), e.key LIMIT %(n)s
"""
# seq -1: named by a document's own properties (its authors), not by a chunk
_STATS = """
SELECT count(*) FILTER (WHERE seq >= 0) AS chunks, coalesce(sum(n), 0) AS mentions, count(DISTINCT file_id) AS files
  FROM entity_mentions WHERE entity_id = %(e)s
"""
_RELATED = """
WITH m AS MATERIALIZED (SELECT file_id, seq FROM entity_mentions WHERE entity_id = %(e)s AND seq >= 0
                         ORDER BY file_id DESC, seq LIMIT %(sample)s),
r AS MATERIALIZED (
    SELECT o.entity_id, count(*) AS shared FROM m
      JOIN entity_mentions o ON o.file_id = m.file_id AND o.seq = m.seq AND o.entity_id <> %(e)s
     GROUP BY o.entity_id
),
rx AS MATERIALIZED (SELECT r.entity_id, r.shared, x.type, x.key, x.name FROM r JOIN entities x ON x.id = r.entity_id)
SELECT rx.entity_id, rx.shared, rx.type, rx.key, rx.name, (SELECT count(*) FROM rx) AS total,
       (SELECT jsonb_object_agg(t.type, t.n) FROM (SELECT type, count(*) AS n FROM rx GROUP BY type) t) AS types
  FROM rx ORDER BY rx.shared DESC, rx.entity_id LIMIT %(k)s
"""
# edges among the entity and its related entities: the chunks of the entity naming both (a hash join of those
# chunks' mentions with themselves), with up to %(per)s of them as evidence, (file id, seq) pairs: their files
# are read once for all edges (_FILES) rather than once a row
_EDGES = """
WITH m AS MATERIALIZED (SELECT file_id, seq FROM entity_mentions WHERE entity_id = %(e)s AND seq >= 0
                         ORDER BY file_id DESC, seq LIMIT %(sample)s),
x AS MATERIALIZED (
    SELECT o.file_id, o.seq, o.entity_id FROM m
      JOIN entity_mentions o ON o.file_id = m.file_id AND o.seq = m.seq AND o.entity_id = ANY(%(ids)s)
)
SELECT a.entity_id AS a, b.entity_id AS b, count(*) AS shared,
       (array_agg(ARRAY[a.file_id, a.seq] ORDER BY a.file_id, a.seq))[1:%(per)s] AS evidence
  FROM x a JOIN x b ON b.file_id = a.file_id AND b.seq = a.seq AND a.entity_id < b.entity_id
 GROUP BY a.entity_id, b.entity_id
 ORDER BY count(*) DESC, a.entity_id, b.entity_id LIMIT %(n)s
"""
_FILES = "SELECT id, source_id, key FROM files WHERE id = ANY(%(ids)s)"
# the relations stated with the entity on one side: grouped first, evidence as (file id, seq) pairs (_FILES
# resolves them), every type counted before the cap
_TYPED = """
WITH r AS MATERIALIZED (
    SELECT subject_id, object_id, type, count(*) AS n,
           (array_agg(ARRAY[file_id, seq] ORDER BY file_id, seq))[1:3] AS evidence
      FROM entity_relations WHERE subject_id = %(e)s OR object_id = %(e)s
     GROUP BY subject_id, object_id, type
)
SELECT r.subject_id, r.object_id, r.type, r.n, r.evidence,
       (SELECT jsonb_object_agg(t.type, t.n) FROM (SELECT type, count(*) AS n FROM r GROUP BY type) t) AS types
  FROM r ORDER BY r.n DESC, r.type, r.subject_id, r.object_id LIMIT %(n)s
"""
# the chunks naming it most: chosen from its mentions alone, then joined to their files and chunks
_TOP_CHUNKS = """
SELECT f.source_id, f.key, m.seq, m.n, c.page_no, left(c.text, 240) AS head
  FROM (SELECT file_id, seq, n FROM entity_mentions WHERE entity_id = %(e)s
         ORDER BY n DESC, file_id, seq LIMIT %(n)s) m
  JOIN files f ON f.id = m.file_id
  JOIN chunks c ON c.file_id = m.file_id AND c.seq = m.seq
 ORDER BY m.n DESC, m.file_id, m.seq
"""


async def _rows(conn: Connection, sql: str, params: dict[str, Any], *, custom: bool = False) -> list[Any]:
    """A statement's rows. `custom`: planned for these parameters every time (never server-side prepared): for
    the joins over an entity's chunks, whose generic plan — PostgreSQL may switch to it from the sixth run on —
    knows neither how often the entity is named nor how many ids an edge query carries, and took 6 s where the
    custom plan takes 80 ms (bench entity-graph). The others are index lookups, whose cached plan saves the
    5-10 ms of planning their row-level-security policies cost."""
    return await (await conn.execute(sql, params, prepare=False if custom else None)).fetchall()


async def _files(conn: Connection, ids: set[int]) -> dict[int, tuple[uuid.UUID, str]]:
    """file id -> (source id, key), for the files the caller may read among `ids`."""
    return {r.id: (r.source_id, r.key) for r in await _rows(conn, _FILES, {"ids": sorted(ids)})} if ids else {}


def _cited(where: dict[int, tuple[uuid.UUID, str]], pairs: list[list[int]]) -> list[tuple[uuid.UUID, str, int]]:
    """(file id, seq) evidence pairs as (source id, key, seq), for the files the caller may read (_files)."""
    return [(*where[int(f)], int(q)) for f, q in pairs if int(f) in where]


async def resolve(conn: Connection, name: str, entity_type: str | None) -> Entity:
    """The one entity the caller can see by this name (canonical: case, punctuation and legal suffixes do
    not matter), or InvalidArgument on `name` with suggestions (not found, or one name of several types)."""
    if entity_type is not None and entity_type not in TYPES:
        raise InvalidArgument("type", f"must be one of {', '.join(TYPES)}")
    key = canonical_key(name)
    if not key:
        raise InvalidArgument("name", "needs letters or digits")
    rows = await _rows(conn, _BY_KEY, {"key": key, "type": entity_type})
    if len(rows) == 1:
        r = rows[0]
        return Entity(r.id, r.type, r.key, r.name)
    if rows:
        names = ", ".join(f"'{r.name}' ({r.type})" for r in rows)
        raise InvalidArgument("name", f"ambiguous: {names}; give `type` to choose one")
    first = key.split()[0]
    like = first.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    found = await _rows(conn, _SUGGEST, {"prefix": like[:4] + "%", "word": f"% {like}%",
                                                 "n": SUGGESTIONS})
    hint = ("; did you mean: " + ", ".join(f"'{r.name}' ({r.type})" for r in found)) if found else \
        "; search_content finds the names the documents use"
    raise InvalidArgument("name", f"no entity '{name}'{' of type ' + entity_type if entity_type else ''} in what "
                                  f"you can read{hint}")


async def neighbourhood(conn: Connection, entity: Entity, *, related: int, edges: int, evidence: int,
                        top_chunks: int) -> Graph:
    """The entity's statistics, its `related` best co-occurring entities, up to `edges` edges among them and
    it, `evidence` chunks per edge from the entity, and its `top_chunks` chunks (most mentions first)."""
    graph = Graph(entity)
    [stats] = await _rows(conn, _STATS, {"e": entity.id})
    graph.chunks, graph.mentions, graph.files = int(stats.chunks), int(stats.mentions), int(stats.files)
    graph.sampled = min(graph.chunks, SAMPLE_CHUNKS)
    rows = await _rows(conn, _RELATED, {"e": entity.id, "k": max(related, 1), "sample": SAMPLE_CHUNKS}, custom=True)
    graph.related_total = int(rows[0].total) if rows else 0
    graph.related_types = {k: int(v) for k, v in (rows[0].types or {}).items()} if rows else {}
    graph.related = [(Entity(r.entity_id, r.type, r.key, r.name), int(r.shared)) for r in rows[:related]]
    ids = [entity.id, *(e.id for e, _ in graph.related)]
    if edges and graph.related:
        rows = await _rows(conn, _EDGES, {"e": entity.id, "ids": ids, "n": edges, "per": max(evidence, 1),
                                          "sample": SAMPLE_CHUNKS}, custom=True)
        graph.edges = [(r.a, r.b, int(r.shared)) for r in rows]
        if evidence:
            where = await _files(conn, {int(f) for r in rows for f, _ in r.evidence})
            for r in rows:
                graph.evidence[(r.a, r.b)] = _cited(where, r.evidence)
    typed = await _rows(conn, _TYPED, {"e": entity.id, "n": max(edges, 1)})
    graph.typed_types = {k: int(v) for k, v in (typed[0].types or {}).items()} if typed else {}
    if edges and typed:
        where = await _files(conn, {int(f) for r in typed for f, _ in r.evidence})
        graph.typed = [(r.subject_id, r.object_id, r.type, int(r.n),
                        _cited(where, r.evidence)) for r in typed]
    if top_chunks:
        graph.top_chunks = [dict(r._asdict()) for r in await _rows(conn, _TOP_CHUNKS, {"e": entity.id,
                                                                                          "n": top_chunks})]
    return graph


# -- the graph around a file or a chunk (get_contents expand.graph) -------------------------------------------

# the entities a file (or one of its chunks) names, most mentioned first
_NAMED = """
SELECT e.id, e.type, e.key, e.name, sum(m.n) AS n FROM files f
  JOIN entity_mentions m ON m.file_id = f.id AND (CAST(%(seq)s AS integer) IS NULL OR m.seq = %(seq)s)
  JOIN entities e ON e.id = m.entity_id
 WHERE f.source_id = %(s)s AND f.key = %(k)s AND f.tenant_id = kdbl_tenant()
 GROUP BY e.id ORDER BY sum(m.n) DESC, e.id LIMIT %(n)s
"""
# the relations its sentences state
_STATED_IN = """
SELECT r.subject_id, r.object_id, r.type, count(*) AS n,
       (array_agg(ARRAY[r.file_id, r.seq] ORDER BY r.seq))[1:3] AS evidence
  FROM files f JOIN entity_relations r ON r.file_id = f.id AND (CAST(%(seq)s AS integer) IS NULL OR r.seq = %(seq)s)
 WHERE f.source_id = %(s)s AND f.key = %(k)s AND f.tenant_id = kdbl_tenant()
 GROUP BY r.subject_id, r.object_id, r.type ORDER BY count(*) DESC, r.type LIMIT %(n)s
"""
# the second hop: each seed's closest co-occurring entities over its most recent chunks, among those the item
# itself does not name
_PARTNERS = """
WITH m AS MATERIALIZED (
    SELECT s.seed, x.file_id, x.seq FROM unnest(CAST(%(ids)s AS bigint[])) AS s(seed)
     CROSS JOIN LATERAL (SELECT file_id, seq FROM entity_mentions WHERE entity_id = s.seed AND seq >= 0
                          ORDER BY file_id DESC, seq LIMIT %(sample)s) x
), r AS (
    SELECT m.seed, o.entity_id, count(*) AS shared,
           (array_agg(ARRAY[m.file_id, m.seq] ORDER BY m.file_id DESC, m.seq))[1:2] AS evidence
      FROM m JOIN entity_mentions o ON o.file_id = m.file_id AND o.seq = m.seq
                            AND o.entity_id <> ALL(CAST(%(ids)s AS bigint[]))  -- partners not named here
     GROUP BY m.seed, o.entity_id
), ranked AS (
    SELECT r.*, row_number() OVER (PARTITION BY r.seed ORDER BY r.shared DESC, r.entity_id) AS k FROM r
)
SELECT ranked.seed, ranked.entity_id, ranked.shared, ranked.evidence, e.type, e.key, e.name
  FROM ranked JOIN entities e ON e.id = ranked.entity_id WHERE ranked.k <= %(per)s
 ORDER BY ranked.seed, ranked.k
"""
AROUND_ENTITIES = 25  # hop 1: entities named, per item
AROUND_PARTNERS = 3   # hop 2: partners per hop-1 entity
AROUND_SAMPLE = 200   # hop 2: chunks of each hop-1 entity looked at


@dataclass(slots=True)
class Around:
    """The graph around a file or chunk: the entities it names (hop 1) and, with hops 2, theirs."""

    entities: dict[int, tuple[Entity, int | None]] = field(default_factory=dict)  # id -> (entity, mentions here)
    # (subject, object, type, weight, evidence) — typed from this item's sentences, CO_OCCURS for hop 2
    relationships: list[tuple[int, int, str, int, list[tuple[uuid.UUID, str, int]]]] = field(default_factory=list)


async def around(conn: Connection, source_id: uuid.UUID, key: str, seq: int | None, hops: int) -> Around:
    """The entities a file (seq None) or chunk names, the relations stated there, and with `hops` 2 each
    entity's closest partners elsewhere (CO_OCCURS), all under row-level security."""
    found = Around()
    if hops < 1:
        return found
    params = {"s": source_id, "k": key, "seq": seq}
    for r in await _rows(conn, _NAMED, {**params, "n": AROUND_ENTITIES}):
        found.entities[r.id] = (Entity(r.id, r.type, r.key, r.name), int(r.n))
    stated = await _rows(conn, _STATED_IN, {**params, "n": 100})
    partners = await _rows(conn, _PARTNERS, {"ids": list(found.entities), "sample": AROUND_SAMPLE,
                                             "per": AROUND_PARTNERS}, custom=True) if hops > 1 and found.entities else []
    where = await _files(conn, {int(f) for r in [*stated, *partners] for f, _ in r.evidence})
    for r in stated:
        found.relationships.append((r.subject_id, r.object_id, r.type, int(r.n),
                                    _cited(where, r.evidence)))
    for r in partners:
        found.entities.setdefault(r.entity_id, (Entity(r.entity_id, r.type, r.key, r.name), None))
        a, b = sorted((r.seed, r.entity_id))
        found.relationships.append((a, b, CO_OCCURS, int(r.shared),
                                    _cited(where, r.evidence)))
    return found
