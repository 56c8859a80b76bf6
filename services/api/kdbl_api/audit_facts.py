"""What a call did, as the handler returns it, and the one function that turns it into an audit row.

Handlers (tools, resources, downloads) used to fill a shared context (`ctx.source_ids.append(...)`,
`ctx.row_count = ...`) that three places then copied into `audit.record` with their own rules (the
MCP server, downloads, and the front door's refusals). Now a handler returns `AuditFacts` next to its
result, a refusal or failure is `AuditFacts.refused(status, reason)`, and `audit_row` builds every
row from the principal, the request and the facts: one row per call or refusal, same columns as
before. Writing it stays one INSERT in the call's own transaction (`write`), or in a transaction of
its own for a call that failed or was refused (`write_alone`): no extra round trip.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from kdbl_core.db import audit
from kdbl_core.db.async_pool import AsyncPool, Connection
from kdbl_core.db.connect import rls_transaction
from kdbl_core.principal import Principal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditFacts:
    """What the audit row says a call did. `mode` (the retrieval mode a search used) feeds /capacity's
    latency per mode, not the row."""

    status: str = "ok"  # one of kdbl_core.db.audit.STATUSES
    error: str | None = None
    source_ids: Sequence[str] = ()
    keys: Sequence[str] = ()
    row_count: int = 0
    mode: str | None = None

    @classmethod
    def refused(cls, status: str, reason: str) -> AuditFacts:
        """A call refused or failed before it read anything."""
        return cls(status=status, error=reason)

    def failed(self, status: str, reason: str) -> AuditFacts:
        """These facts (what was asked for) with the reason it did not succeed."""
        return dataclasses.replace(self, status=status, error=reason, row_count=0)


def audit_row(principal: Principal, request: HTTPConnection | None, tool: str, arguments: dict[str, Any],
              facts: AuditFacts, started: float) -> dict[str, Any]:
    """The row's columns (kdbl_core.db.audit.record_and_commit bounds and stores them)."""
    client = request.client if request is not None else None
    return {
        "tenant_id": principal.tenant_id, "principal": principal.subject, "token_id": principal.token_id,
        "tool": tool, "arguments": arguments if isinstance(arguments, dict) else {},
        "source_ids": facts.source_ids, "keys": facts.keys, "row_count": facts.row_count,
        "status": facts.status, "error": facts.error, "client_ip": client.host if client else None,
        "duration_ms": (time.perf_counter() - started) * 1000,
    }


async def write(conn: Connection, row: dict[str, Any]) -> None:
    """The row, as the call's transaction's last statement: it is sent with the COMMIT in one round trip
    (it commits with what the call read)."""
    await audit.record_and_commit(conn, **row)


async def write_alone(pool: AsyncPool, principal: Principal, row: dict[str, Any], *,
                      must: bool = False) -> None:
    """The row in its own transaction (a refused or failed call; a download). Unless `must` (a download
    is not served unaudited), a failed write is logged, not raised: the caller's answer to a refusal
    must not turn into an audit failure."""
    try:
        async with rls_transaction(pool, principal) as conn:
            await audit.record_and_commit(conn, **row)
    except Exception:
        if must:
            raise
        log.exception("audit write failed", extra={"tool": row["tool"], "status": row["status"]})
