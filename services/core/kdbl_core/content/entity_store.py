"""Entities in the database (migration 0025): which files wait for extraction, and their mentions written.

The worker's background stage (kdbl_worker.entity_stage) claims files of sources with `entities: true`
whose `entities_version` is not this extractor's (SKIP LOCKED: workers share the work), reads their chunks,
and writes each chunk's entities (kdbl_core.content.entities) in one transaction per batch: the entities
(one per tenant, type and canonical name: the first surface form seen names it), the file's mentions
replacing its old ones, and the version. A source switched off loses its mentions (`forget_switched_off`).
"""

from __future__ import annotations

import re
import uuid
from collections import Counter
from email.utils import getaddresses

from kdbl_core.content import entities, entity_relations
from kdbl_core.db.connect import Connection

VERSION = 2  # kdbl_core.content.entities' rules; one that finds other entities comes with a migration that sets
# the files it reads otherwise back to NULL (NULL: waiting; the pending index has exactly those). 2: e-mail
# recipients, names end at blank lines and headings (migration 0026 set every file back).
MAIL_TYPES = ("message/rfc822", "application/vnd.ms-outlook")

_ON = "coalesce((s.config ->> 'entities')::boolean, false)"
_TENANTS = f"SELECT s.tenant_id, array_agg(s.id) FILTER (WHERE {_ON}) AS sources FROM sources s GROUP BY s.tenant_id"
# sources switched off whose files still have entities (files_entities_read_idx answers the EXISTS)
_SWITCHED_OFF = f"""
SELECT s.id FROM sources s
 WHERE s.tenant_id = %(t)s AND NOT {_ON}
   AND EXISTS (SELECT 1 FROM files f WHERE f.source_id = s.id AND f.entities_version IS NOT NULL)
"""
_CLAIM = """
SELECT f.id, f.source_id, f.authors, f.content_type FROM files f
 WHERE f.source_id = ANY(%(s)s) AND f.entities_version IS NULL AND f.chunk_count > 0
 ORDER BY f.source_id, f.id LIMIT %(n)s FOR UPDATE OF f SKIP LOCKED
"""
_CHUNKS = "SELECT file_id, seq, text FROM chunks WHERE file_id = ANY(%(ids)s) ORDER BY file_id, seq"
_ENTITIES = """
WITH v AS (SELECT * FROM unnest(CAST(%(types)s AS text[]), CAST(%(keys)s AS text[]), CAST(%(names)s AS text[]))
                         AS v(type, key, name)),
ins AS (INSERT INTO entities (tenant_id, type, key, name) SELECT %(t)s, type, key, name FROM v ORDER BY type, key
        ON CONFLICT (tenant_id, type, key) DO NOTHING RETURNING id, type, key)
SELECT id, type, key FROM ins
UNION ALL
SELECT e.id, e.type, e.key FROM entities e JOIN v ON v.type = e.type AND v.key = e.key WHERE e.tenant_id = %(t)s
"""
_MENTIONS = """
INSERT INTO entity_mentions (tenant_id, entity_id, file_id, seq, source_id, n)
SELECT %(t)s, * FROM unnest(CAST(%(entity)s AS bigint[]), CAST(%(file)s AS bigint[]), CAST(%(seq)s AS int[]),
                            CAST(%(source)s AS uuid[]), CAST(%(n)s AS smallint[]))
ON CONFLICT (file_id, seq, entity_id) DO UPDATE SET n = EXCLUDED.n
"""
_RELATIONS = """
INSERT INTO entity_relations (tenant_id, subject_id, object_id, type, file_id, seq, source_id)
SELECT %(t)s, * FROM unnest(CAST(%(subject)s AS bigint[]), CAST(%(object)s AS bigint[]), CAST(%(type)s AS text[]),
                            CAST(%(file)s AS bigint[]), CAST(%(seq)s AS int[]), CAST(%(source)s AS uuid[]))
ON CONFLICT DO NOTHING
"""
_DONE = """
WITH gone AS (DELETE FROM entity_mentions WHERE file_id = ANY(%(ids)s) AND tenant_id = %(t)s),
gone_relations AS (DELETE FROM entity_relations WHERE file_id = ANY(%(ids)s) AND tenant_id = %(t)s)
UPDATE files SET entities_version = %(v)s WHERE id = ANY(%(ids)s)
"""
_PENDING = f"""
SELECT count(*) FROM files f JOIN sources s ON s.id = f.source_id
 WHERE f.chunk_count > 0 AND f.entities_version IS NULL AND {_ON}{{where}}
"""


def tenants_with_sources(conn: Connection) -> dict[uuid.UUID, list[uuid.UUID]]:
    """Every tenant that has sources -> its sources with entities on (the worker reads sources across
    tenants; files only inside a tenant transaction)."""
    return {r.tenant_id: list(r.sources or []) for r in conn.execute(_TENANTS)}


def pending_files(conn: Connection, source_id: uuid.UUID | None = None) -> int:
    """Files waiting for extraction (of one source, or of every source with entities on)."""
    where = " AND s.id = %(s)s" if source_id is not None else ""
    return int(conn.execute(_PENDING.format(where=where), {"s": source_id}).fetchone()[0])


_RULES = "SELECT kind, key, target_key, target_name FROM entity_rules WHERE tenant_id = %(t)s"
PROPERTIES = -1  # the seq of a mention the document's properties state (its authors, an e-mail's senders)


def document_names(authors: list[str]) -> list[entities.Mention]:
    """The names a document states about itself (files.authors: PDF /Author, Office and EPUB creators, an
    e-mail's From, HTML meta author) as mentions: e-mail addresses left out, "Doe, Jane" read as "Jane Doe",
    an organisation by its suffix, anyone else a person."""
    out = []
    for raw in authors:
        name = " ".join(raw.split())
        if not name or "@" in name or len(name) > 200:
            continue
        last, comma, first = name.partition(",")
        if comma and first.strip() and " " not in last.strip() and "," not in first:
            name = f"{first.strip()} {last.strip()}"
        kind = "ORG" if name.split()[-1].rstrip(".,").casefold() in entities.ORG_WORDS else "PERSON"
        out.append(entities.Mention(0, len(name), name, kind))
    return out


_ADDRESSED = re.compile(r"^(?:To|Cc): (.+)$", re.MULTILINE)


def recipients(text: str) -> list[entities.Mention]:
    """The people (or organisations) an e-mail is addressed to: the display names of the To and Cc lines of the
    header block its text starts with (kdbl_worker.extract.eml / msg), as document_names reads them."""
    head = text.split("\n\n", 1)[0]
    if not head.startswith("From: "):
        return []
    names: list[str] = []
    for value in _ADDRESSED.findall(head):
        if "@" not in value and "<" not in value:  # display names alone (an Outlook .msg): "Jane Doe; Bob Roe"
            names.extend(part for part in value.split(";") if part.strip())
            continue
        try:
            names.extend(name for name, _ in getaddresses([value]) if name)
        except (ValueError, TypeError, IndexError):  # a malformed header names nobody
            continue
    return document_names(names)


def _apply_rules(mentions: list[entities.Mention], aliases: dict[str, tuple[str, str]],
                 blocked: frozenset[str]) -> list[entities.Mention]:
    """An administrator's rules on one chunk's mentions: blocked names dropped, aliases renamed (the alias's
    target name, so its key is the target's)."""
    out = []
    for m in mentions:
        key = m.key
        if key in blocked:
            continue
        if key in aliases:
            target_key, target_name = aliases[key]
            if target_key in blocked:
                continue
            m = entities.Mention(m.start, m.end, target_name, m.type)
        out.append(m)
    return out


def extract_batch(conn: Connection, tenant_id: uuid.UUID, sources: list[uuid.UUID], files: int) -> tuple[int, int]:
    """Claim up to `files` pending files of `sources` (the tenant's with entities on; in the caller's tenant
    transaction), extract their chunks' entities and write them; (files done, mentions written)."""
    claimed = conn.execute(_CLAIM, {"s": sources, "n": files}).fetchall()
    if not claimed:
        return 0, 0
    rules = conn.execute(_RULES, {"t": tenant_id}).fetchall()
    aliases = {r.key: (r.target_key, r.target_name) for r in rules if r.kind == "alias"}
    blocked = frozenset(r.key for r in rules if r.kind == "block")
    ids = [r.id for r in claimed]
    source_of = {r.id: r.source_id for r in claimed}
    stated_names = {r.id: document_names(r.authors) for r in claimed if r.authors}
    mail = {r.id for r in claimed if r.content_type in MAIL_TYPES}
    per_chunk: list[tuple[int, int, Counter[tuple[str, str]]]] = []
    stated: list[tuple[tuple[str, str], tuple[str, str], str, int, int]] = []
    names: dict[tuple[str, str], str] = {}
    for file_id, people in stated_names.items():  # the document's own properties: seq PROPERTIES
        found_here: Counter[tuple[str, str]] = Counter()
        for m in _apply_rules(people, aliases, blocked):
            found_here[(m.type, m.key)] = 1
            names.setdefault((m.type, m.key), m.name)
        if found_here:
            per_chunk.append((file_id, PROPERTIES, found_here))
    for row in conn.execute(_CHUNKS, {"ids": ids}):
        found: Counter[tuple[str, str]] = Counter()
        mentions = _apply_rules([m for m in entities.extract(row.text) if m.key], aliases, blocked)
        for m in mentions:
            ident = (m.type, m.key)
            found[ident] += 1
            names.setdefault(ident, m.name)
        if row.seq == 0 and row.file_id in mail:  # its recipients, named in the header block (once each)
            for m in _apply_rules(recipients(row.text), aliases, blocked):
                found[(m.type, m.key)] = found[(m.type, m.key)] or 1
                names.setdefault((m.type, m.key), m.name)
        if found:
            per_chunk.append((row.file_id, row.seq, found))
        for r in entity_relations.relations(row.text, mentions):
            if r.subject.key != r.object.key:
                stated.append(((r.subject.type, r.subject.key), (r.object.type, r.object.key), r.type,
                               row.file_id, row.seq))
    conn.execute(_DONE, {"ids": ids, "t": tenant_id, "v": VERSION})
    if not names:
        return len(ids), 0
    keys = sorted(names)
    id_of = {(r.type, r.key): r.id for r in conn.execute(_ENTITIES, {
        "t": tenant_id, "types": [k[0] for k in keys], "keys": [k[1] for k in keys], "names": [names[k] for k in keys]})}
    rows = [(id_of[ident], file_id, seq, source_of[file_id], min(n, 32767))
            for file_id, seq, found in per_chunk for ident, n in found.items()]
    conn.execute(_MENTIONS, {"t": tenant_id, "entity": [r[0] for r in rows], "file": [r[1] for r in rows],
                             "seq": [r[2] for r in rows], "source": [r[3] for r in rows], "n": [r[4] for r in rows]})
    if stated:
        conn.execute(_RELATIONS, {"t": tenant_id, "subject": [id_of[s[0]] for s in stated],
                                  "object": [id_of[s[1]] for s in stated], "type": [s[2] for s in stated],
                                  "file": [s[3] for s in stated], "seq": [s[4] for s in stated],
                                  "source": [source_of[s[3]] for s in stated]})
    return len(ids), len(rows)


_FORGET = """
WITH read AS (SELECT id FROM files WHERE source_id = ANY(%(s)s) AND entities_version IS NOT NULL),
gone AS (DELETE FROM entity_mentions WHERE file_id IN (SELECT id FROM read)),
gone_relations AS (DELETE FROM entity_relations WHERE file_id IN (SELECT id FROM read))
UPDATE files SET entities_version = NULL WHERE id IN (SELECT id FROM read)
"""


def forget_switched_off(conn: Connection, tenant_id: uuid.UUID) -> int:
    """The mentions of the tenant's sources whose entities were switched off, deleted (row-level security
    hides them from the moment the config changes); how many files were forgotten."""
    sources = [r[0] for r in conn.execute(_SWITCHED_OFF, {"t": tenant_id})]
    return conn.execute(_FORGET, {"s": sources}).rowcount if sources else 0
