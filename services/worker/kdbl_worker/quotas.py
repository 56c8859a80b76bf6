"""Tenant quotas as one listing spends them (tenants.settings.quotas, kdbl_core.access.policy).

A listing queues no new file past max_files / max_bytes and says so in the run's problems; a source
past max_sources (by creation order) is not listed. Files already indexed stay. Quotas count listed
files only (`parent_id IS NULL`), never container members.
"""

from __future__ import annotations

import uuid

from kdbl_core.access import policy
from kdbl_core.content import store
from kdbl_core.content.records import FileMeta
from kdbl_core.errors import PermanentError


class QuotaExceeded(PermanentError):
    """The tenant's quota leaves no room for this source."""


class Quota:
    """A tenant's quotas as one listing spends them (see the module docstring)."""

    def __init__(self, quotas: dict[str, int], files: int, size: int, sources: int, rank: int) -> None:
        self.max_files, self.max_bytes = quotas.get("max_files"), quotas.get("max_bytes")
        self.max_sources = quotas.get("max_sources")
        self.files, self.bytes, self.sources, self.rank = files, size, sources, rank
        self.over_files = self.over_bytes = 0

    @classmethod
    def load(cls, conn, tenant_id: uuid.UUID, source_id: uuid.UUID) -> Quota:
        row = conn.execute("""
            SELECT t.settings,
                   (SELECT count(*) FROM sources s WHERE s.tenant_id = t.id) AS sources,
                   (SELECT count(*) FROM sources s, sources me WHERE me.id = %(s)s AND s.tenant_id = t.id
                       AND (s.created_at, s.id) <= (me.created_at, me.id)) AS rank
              FROM tenants t WHERE t.id = %(t)s""", {"t": tenant_id, "s": source_id}).fetchone()
        quotas = policy.parse(row.settings).quotas
        files = size = 0
        if "max_files" in quotas or "max_bytes" in quotas:
            files, size = conn.execute("SELECT count(*), coalesce(sum(size), 0) FROM files "
                                       "WHERE tenant_id = %(t)s AND parent_id IS NULL",  # listed files
                                       {"t": tenant_id}).fetchone()
        return cls(dict(quotas), int(files), int(size), int(row.sources), int(row.rank))

    def check_sources(self) -> None:
        if self.max_sources is not None and self.rank > self.max_sources:
            raise QuotaExceeded(f"quota: the tenant has {self.sources} sources and max_sources is "
                                f"{self.max_sources}; this source is not crawled (nothing indexed is removed)")

    def admit(self, remote: FileMeta, state: store.FileState | None) -> bool:
        """Whether queueing this changed file stays within max_files / max_bytes (and spend it)."""
        new = state is None
        grow = max(0, (remote.size or 0) - (0 if new else (state.size or 0)))
        if new and self.max_files is not None and self.files + 1 > self.max_files:
            self.over_files += 1
            return False
        if grow and self.max_bytes is not None and self.bytes + grow > self.max_bytes:
            self.over_bytes += 1
            return False
        self.files += 1 if new else 0
        self.bytes += grow
        return True

    def problems(self) -> list[tuple[str, str]]:
        out = []
        if self.over_files:
            out.append(("quota", f"max_files {self.max_files} reached: {self.over_files} new files not indexed"))
        if self.over_bytes:
            out.append(("quota", f"max_bytes {self.max_bytes} reached: {self.over_bytes} files not indexed "
                                 "(changed files keep their indexed version)"))
        return out
