"""The share's permissions in the database (migration 0023): rule sets by digest, and each listed file's set.

A crawl of a source whose permissions come from the share turns each listed file's permissions into rules
(kdbl_core.access.share_acl) and the rules into a `permission_sets` id, once per distinct digest per
listing (`SetIds`). Files the crawl indexes again get their set with their row (kdbl_core.content.store);
files that did not change get it at the end of the listing (`apply`), without being read again: a
permission changed on the share reaches every result at the next crawl, whatever the content did. Every
change is recorded in `permission_changes` (which file, the set before and after, the crawl's job).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from kdbl_core.access import share_acl
from kdbl_core.access.principal import tenant_transaction
from kdbl_core.db.connect import Connection

_INSERT = """
INSERT INTO permission_sets (tenant_id, digest, rules) VALUES (%(t)s, %(d)s, %(r)s)
ON CONFLICT (tenant_id, digest) DO NOTHING RETURNING id
"""
_SELECT = "SELECT id FROM permission_sets WHERE tenant_id = %(t)s AND digest = %(d)s"
_KNOWN = "SELECT digest, id FROM permission_sets WHERE tenant_id = %(t)s"


class SetIds:
    """Rules -> permission_sets.id for one tenant, each distinct set written (or found) once. The tenant's
    sets are read at the start (one round trip): a re-crawl finds the sets it needs there, where asking
    for each one cost a transaction (116 sets: 0.09 s of a 0.12 s listing of 1,000 files)."""

    def __init__(self, pool: ConnectionPool, tenant_id: uuid.UUID) -> None:
        self.pool, self.tenant_id = pool, tenant_id
        with tenant_transaction(pool, tenant_id) as conn:
            self._ids: dict[str, int] = dict(conn.execute(_KNOWN, {"t": tenant_id}).fetchall())

    def __len__(self) -> int:
        return len(self._ids)

    def id_for(self, rules: share_acl.Rules) -> int:
        digest = share_acl.digest(rules)
        found = self._ids.get(digest)
        if found is None:
            params = {"t": self.tenant_id, "d": digest, "r": Jsonb(rules)}
            with tenant_transaction(self.pool, self.tenant_id) as conn:
                row = conn.execute(_INSERT, params).fetchone() or conn.execute(_SELECT, params).fetchone()
            found = self._ids[digest] = row[0]
        return found


# One statement: the listed files whose set differs take the new one, their members (archive entries,
# attachments) with them, and each change is logged. `old` is read before the updates (one snapshot).
_APPLY = """
WITH v AS (
    SELECT * FROM unnest(CAST(%(keys)s AS text[]), CAST(%(sets)s AS bigint[])) AS v(key, set)
), old AS (
    SELECT f.id, f.key, f.permission_set AS before, v.set AS after
      FROM files f JOIN v ON v.key = f.key
     WHERE f.source_id = %(source)s AND f.parent_id IS NULL AND f.permission_set IS DISTINCT FROM v.set
), upd AS (
    UPDATE files f SET permission_set = o.after FROM old o WHERE f.id = o.id OR f.parent_id = o.id
), log AS (
    INSERT INTO permission_changes (tenant_id, source_id, job_id, file_key, before_set, after_set)
    SELECT %(tenant)s, %(source)s, %(job)s, o.key, o.before, o.after FROM old o
)
SELECT count(*) FROM old
"""


def apply(conn: Connection, tenant_id: uuid.UUID, source_id: uuid.UUID, job_id: int | None,
          sets: dict[str, int]) -> int:
    """Give the source's listed files in `sets` (key -> permission set) their set where it changed; the
    number of files changed."""
    if not sets:
        return 0
    keys: Sequence[str] = list(sets)
    [changed] = conn.execute(_APPLY, {"keys": keys, "sets": [sets[k] for k in keys], "source": source_id,
                                      "tenant": tenant_id, "job": job_id}).fetchone()
    return changed
