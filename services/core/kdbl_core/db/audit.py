"""Append-only audit rows: one per MCP call or download (the API role may insert, never read)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from kdbl_core.db import driver

_INSERT = """
INSERT INTO audit (tenant_id, principal, token_id, tool, arguments, source_ids, keys, row_count, status,
                   error, client_ip, duration_ms)
VALUES (:tenant_id, :principal, :token_id, :tool, CAST(:arguments AS jsonb), CAST(:source_ids AS uuid[]),
        :keys, :row_count, :status, :error, :client_ip, :duration_ms)
"""


async def record(
    conn: AsyncConnection,
    *,
    tenant_id: uuid.UUID,
    principal: str,
    token_id: uuid.UUID | None,
    tool: str,
    arguments: dict[str, Any],
    source_ids: Sequence[str],
    keys: Sequence[str],
    row_count: int,
    status: str,
    error: str | None,
    client_ip: str | None,
    duration_ms: float,
) -> None:
    await driver.execute(conn, _INSERT, {
        "tenant_id": tenant_id, "principal": principal, "token_id": token_id, "tool": tool,
        "arguments": json.dumps(arguments, default=str)[:20000], "source_ids": sorted(set(source_ids)),
        "keys": list(dict.fromkeys(keys))[:1000], "row_count": row_count, "status": status,
        "error": (error or None) and error[:2000], "client_ip": client_ip, "duration_ms": duration_ms,
    })
