"""Who is calling: the identity every RLS transaction is opened for."""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

SCOPE_SEARCH = "kdbl.search"
SCOPE_READ = "kdbl.read"
ALL_SCOPES = (SCOPE_SEARCH, SCOPE_READ)


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: UUID
    tenant_name: str
    subject: str  # 'user:<name>'
    groups: tuple[str, ...] = ()
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: UUID | None = None

    @property
    def subjects(self) -> list[str]:
        """The subject plus one 'group:<name>' entry per group: what grants are matched against."""
        return [self.subject, *(f"group:{g}" for g in self.groups)]
