"""A listing of a source whose permissions come from the share (issue 30): each listed file's permissions as
rules (kdbl_core.access.share_acl), their permission set on the file as it is queued, and at the end of the
listing the sets of files that did not change applied (kdbl_core.access.share_sets)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import replace

from kdbl_core.access import share_acl, share_sets
from kdbl_core.content import store
from kdbl_core.content.records import FileMeta
from kdbl_core.db.connect import Connection, Pool

log = logging.getLogger(__name__)


class SharePermissions:
    """A from-source listing: each file's permissions as rules (kdbl_core.access.share_acl), their set's id
    on the file as it is queued, and at the end those of unchanged files applied (share_sets.apply)."""

    def __init__(self, pool: Pool, tenant_id: uuid.UUID, source_id: uuid.UUID, permission_map: dict | None) -> None:
        self.tenant_id, self.source_id = tenant_id, source_id
        self.names = share_acl.PrincipalMap(dict(permission_map or {}))
        self.ids = share_sets.SetIds(pool, tenant_id)
        self.sets: dict[str, int] = {}
        self._by_access: dict[object, int] = {}

    def file(self, remote: FileMeta) -> FileMeta:
        set_id = self._by_access.get(remote.access)  # files that share their permissions share the work
        if set_id is None:
            if remote.access is None:  # a connector that lists none: nobody reads it but by a grant
                rules: share_acl.Rules = ((),)
            else:
                rules = share_acl.rules_for(remote.access, self.names)
            set_id = self._by_access[remote.access] = self.ids.id_for(rules)
        self.sets[remote.key] = set_id
        return replace(remote, access=None, permission_set=set_id)

    def apply(self, conn: Connection, job_id: int, known: dict[str, store.FileState]) -> None:
        changed = {k: v for k, v in self.sets.items() if k in known and known[k].permission_set != v}
        done = share_sets.apply(conn, self.tenant_id, self.source_id, job_id, changed)
        if done:
            log.info("permissions from the share changed for %d files", done,
                     extra={"source_id": str(self.source_id), "job_id": job_id, "permission_sets": len(self.ids)})
