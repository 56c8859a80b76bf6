"""What a tool handler gets: the open RLS connection, the principal, settings, and an audit sink."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncConnection

from kdbl_core.principal import Principal
from kdbl_core.settings import Settings


@dataclass(slots=True)
class ToolContext:
    conn: AsyncConnection
    principal: Principal
    settings: Settings
    # filled by the handler for the audit row
    source_ids: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    row_count: int = 0
