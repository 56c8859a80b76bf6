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
_STATS = """
SELECT count(*) AS chunks, coalesce(sum(n), 0) AS mentions, count(DISTINCT file_id) AS files
  FROM entity_mentions WHERE entity_id = %(e)s
"""
_RELATED = """
WITH m AS MATERIALIZED (SELECT file_id, seq FROM entity_mentions WHERE entity_id = %(e)s),
r AS MATERIALIZED (
    SELECT o.entity_id, count(*) AS shared FROM m
      JOIN entity_mentions o ON o.file_id = m.file_id AND o.seq = m.seq AND o.entity_id <> %(e)s
     GROUP BY o.entity_id
)
SELECT r.entity_id, r.shared, x.type, x.key, x.name, count(*) OVER () AS total,
       count(*) OVER (PARTITION BY x.type) AS of_type
  FROM r JOIN entities x ON x.id = r.entity_id
 ORDER BY r.shared DESC, r.entity_id
"""
# edges among the entity and its related entities: the chunks of the entity naming both, up to %(per)s of them
# as evidence (their files read under row-level security like everything else)
_EDGES = """
WITH m AS MATERIALIZED (SELECT file_id, seq FROM entity_mentions WHERE entity_id = %(e)s),
p AS (
    SELECT a.entity_id AS a, b.entity_id AS b, m.file_id, m.seq FROM m
      JOIN entity_mentions a ON a.file_id = m.file_id AND a.seq = m.seq AND a.entity_id = ANY(%(ids)s)
      JOIN entity_mentions b ON b.file_id = m.file_id AND b.seq = m.seq AND b.entity_id = ANY(%(ids)s)
                            AND a.entity_id < b.entity_id
)
SELECT p.a, p.b, count(*) AS shared,
       (array_agg(ARRAY[f.source_id::text, f.key, p.seq::text] ORDER BY p.file_id, p.seq))[1:%(per)s] AS evidence
  FROM p JOIN files f ON f.id = p.file_id
 GROUP BY p.a, p.b
 ORDER BY count(*) DESC, p.a, p.b LIMIT %(n)s
"""
_TYPED = """
SELECT r.subject_id, r.object_id, r.type, count(*) AS n, count(*) OVER (PARTITION BY r.type) AS of_type,
       (array_agg(ARRAY[f.source_id::text, f.key, r.seq::text] ORDER BY r.file_id, r.seq))[1:3] AS evidence
  FROM entity_relations r JOIN files f ON f.id = r.file_id
 WHERE r.subject_id = %(e)s OR r.object_id = %(e)s
 GROUP BY r.subject_id, r.object_id, r.type
 ORDER BY count(*) DESC, r.type, r.subject_id, r.object_id
"""
_TOP_CHUNKS = """
SELECT f.source_id, f.key, m.seq, m.n, c.page_no, left(c.text, 240) AS head FROM entity_mentions m
  JOIN files f ON f.id = m.file_id
  JOIN chunks c ON c.file_id = m.file_id AND c.seq = m.seq
 WHERE m.entity_id = %(e)s
 ORDER BY m.n DESC, m.file_id, m.seq LIMIT %(n)s
"""


async def resolve(conn: Connection, name: str, entity_type: str | None) -> Entity:
    """The one entity the caller can see by this name (canonical: case, punctuation and legal suffixes do
    not matter), or InvalidArgument on `name` with suggestions (not found, or one name of several types)."""
    if entity_type is not None and entity_type not in TYPES:
        raise InvalidArgument("type", f"must be one of {', '.join(TYPES)}")
    key = canonical_key(name)
    if not key:
        raise InvalidArgument("name", "needs letters or digits")
    rows = await (await conn.execute(_BY_KEY, {"key": key, "type": entity_type})).fetchall()
    if len(rows) == 1:
        r = rows[0]
        return Entity(r.id, r.type, r.key, r.name)
    if rows:
        names = ", ".join(f"'{r.name}' ({r.type})" for r in rows)
        raise InvalidArgument("name", f"ambiguous: {names}; give `type` to choose one")
    first = key.split()[0]
    like = first.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    found = await (await conn.execute(_SUGGEST, {"prefix": like[:4] + "%", "word": f"% {like}%",
                                                 "n": SUGGESTIONS})).fetchall()
    hint = ("; did you mean: " + ", ".join(f"'{r.name}' ({r.type})" for r in found)) if found else \
        "; search_content finds the names the documents use"
    raise InvalidArgument("name", f"no entity '{name}'{' of type ' + entity_type if entity_type else ''} in what "
                                  f"you can read{hint}")


async def neighbourhood(conn: Connection, entity: Entity, *, related: int, edges: int, evidence: int,
                        top_chunks: int) -> Graph:
    """The entity's statistics, its `related` best co-occurring entities, up to `edges` edges among them and
    it, `evidence` chunks per edge from the entity, and its `top_chunks` chunks (most mentions first)."""
    graph = Graph(entity)
    stats = await (await conn.execute(_STATS, {"e": entity.id})).fetchone()
    graph.chunks, graph.mentions, graph.files = int(stats.chunks), int(stats.mentions), int(stats.files)
    rows = await (await conn.execute(_RELATED, {"e": entity.id})).fetchall()
    graph.related_total = int(rows[0].total) if rows else 0
    graph.related_types = {r.type: int(r.of_type) for r in rows}
    graph.related = [(Entity(r.entity_id, r.type, r.key, r.name), int(r.shared)) for r in rows[:related]]
    ids = [entity.id, *(e.id for e, _ in graph.related)]
    if edges and graph.related:
        for r in await (await conn.execute(_EDGES, {"e": entity.id, "ids": ids, "n": edges,
                                                    "per": max(evidence, 1)})).fetchall():
            graph.edges.append((r.a, r.b, int(r.shared)))
            if evidence:
                graph.evidence[(r.a, r.b)] = [(uuid.UUID(s), k, int(q)) for s, k, q in r.evidence]
    typed = await (await conn.execute(_TYPED, {"e": entity.id})).fetchall()
    graph.typed_types = {r.type: int(r.of_type) for r in typed}
    graph.typed = [(r.subject_id, r.object_id, r.type, int(r.n),
                    [(uuid.UUID(s), k, int(q)) for s, k, q in r.evidence]) for r in typed[:edges]]
    if top_chunks:
        graph.top_chunks = [dict(r._asdict()) for r in await (await conn.execute(
            _TOP_CHUNKS, {"e": entity.id, "n": top_chunks})).fetchall()]
    return graph
