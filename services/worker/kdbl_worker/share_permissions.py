"""A listing of a source whose permissions come from the share (issue 30): each listed file's permissions as
rules (kdbl_core.access.share_acl), their permission set on the file as it is queued, and at the end of the
listing the sets of files that did not change applied (kdbl_core.access.share_sets).

An SMB source with `permission_checks: changed` reads a file's security descriptor only when its change
time (`FileMeta.access_stamp`) moved since it was last read, and every file's once
`permission_full_check_hours` have passed since the source's last full check (`sources.permissions_checked_at`,
migration 0024); the others keep their set. See kdbl_worker.connectors.smb for the servers where that is safe.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kdbl_core.access import share_acl, share_sets
from kdbl_core.content import store
from kdbl_core.content.records import FileMeta
from kdbl_core.db.connect import Connection, Pool
from kdbl_core.sources import config as source_config

log = logging.getLogger(__name__)

_CHECKED_AT = "SELECT permissions_checked_at FROM sources WHERE id = %(s)s"
_FULL_CHECK_DONE = "UPDATE sources SET permissions_checked_at = now() WHERE id = %(s)s"
# the stamps the listing read descriptors with, where they moved (files written since the listing started
# and not yet in the table get theirs at the next listing: they are asked again, never skipped wrongly)
_STAMPS = """
UPDATE files f SET access_stamp = v.stamp
  FROM unnest(CAST(%(keys)s AS text[]), CAST(%(stamps)s AS text[])) AS v(key, stamp)
 WHERE f.source_id = %(s)s AND f.key = v.key AND f.parent_id IS NULL AND f.access_stamp IS DISTINCT FROM v.stamp
"""


class SharePermissions:
    """A from-source listing: each file's permissions as rules (kdbl_core.access.share_acl), their set's id
    on the file as it is queued, and at the end those of unchanged files applied (share_sets.apply)."""

    def __init__(self, pool: Pool, source: Any, known: dict[str, store.FileState]) -> None:
        self.tenant_id, self.source_id, self.known = source.tenant_id, source.id, known
        self.names = share_acl.PrincipalMap(dict(source.permission_map or {}))
        self.ids = share_sets.SetIds(pool, source.tenant_id)
        self.sets: dict[str, int] = {}
        self.stamps: dict[str, str | None] = {}  # None: its descriptor could not be read (asked again next time)
        self.kept = 0
        self._by_access: dict[object, int] = {}
        self.by_change_time = self.full_check = False
        if source.protocol == "smb":
            cfg = source_config.parse("smb", source.config)
            if cfg.permission_checks == "changed":
                with pool.connection() as conn:
                    [checked] = conn.execute(_CHECKED_AT, {"s": source.id}).fetchone()
                due = checked is None or datetime.now(UTC) - checked >= timedelta(hours=cfg.permission_full_check_hours)
                self.by_change_time, self.full_check = True, due

    def walk_options(self) -> dict[str, Any]:
        """The connector's walk() arguments: permissions listed, and for `changed` checks which to skip."""
        options: dict[str, Any] = {"access": True}
        if self.by_change_time and not self.full_check:
            options["skip_access"] = self.unchanged
        return options

    def unchanged(self, key: str, stamp: str | None) -> bool:
        """Whether `key`'s permissions were read with this very stamp and gave the set it has."""
        state = self.known.get(key)
        return (stamp is not None and state is not None and state.access_stamp == stamp
                and state.permission_set is not None)

    def file(self, remote: FileMeta) -> FileMeta:
        if remote.access is share_acl.UNCHANGED:  # not read again (unchanged()): the set it has
            self.kept += 1
            set_id = self.known[remote.key].permission_set
        else:
            set_id = self._by_access.get(remote.access)  # files that share their permissions share the work
            if set_id is None:
                if remote.access is None:  # a connector that lists none: nobody reads it but by a grant
                    rules: share_acl.Rules = ((),)
                else:
                    rules = share_acl.rules_for(remote.access, self.names)
                set_id = self._by_access[remote.access] = self.ids.id_for(rules)
        self.sets[remote.key] = set_id
        if self.by_change_time:
            self.stamps[remote.key] = remote.access_stamp
        return replace(remote, access=None, permission_set=set_id)

    def apply(self, conn: Connection, job_id: int, known: dict[str, store.FileState]) -> None:
        changed = {k: v for k, v in self.sets.items() if k in known and known[k].permission_set != v}
        done = share_sets.apply(conn, self.tenant_id, self.source_id, job_id, changed)
        if self.by_change_time:
            stamps = {k: v for k, v in self.stamps.items() if k in known and known[k].access_stamp != v}
            if stamps:
                conn.execute(_STAMPS, {"s": self.source_id, "keys": list(stamps), "stamps": list(stamps.values())})
            if self.full_check:
                conn.execute(_FULL_CHECK_DONE, {"s": self.source_id})
        if done or self.kept:
            log.info("permissions from the share: %d files changed, %d kept unread (change time)", done,
                     self.kept, extra={"source_id": str(self.source_id), "job_id": job_id,
                                       "permission_sets": len(self.ids), "full_check": self.full_check})
