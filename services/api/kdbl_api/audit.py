"""The audit trail: one append-only row per MCP call, refusal or download, built in one place.

Every call leaves one, refused or not (the API role may insert rows, never read them). `status` is
one of STATUSES: ok; error (the tool failed: bad arguments, not found, or an unexpected internal
error, named in `error`); denied (403: scope, tenant disabled, policy); rate_limited (429: a rate
tier, or the tenant's call slots full: kdbl_api.fair_share); timeout (the call passed its deadline:
rolled back, then audited in a transaction of its own); unauthenticated (401 for a known token of the
tenant: wrong secret, revoked, expired). `error` holds the reason, never a secret.

A handler (tool, resource, download) returns `AuditFacts` next to its result; a refusal or failure is
`AuditFacts.refused(status, reason)`; `audit_row` builds every row from the principal, the request
and the facts. Handlers used to fill a shared context that three places copied into the row with
their own rules (the MCP server, downloads, the front door's refusals). The row is the last
statement of the call's own transaction, sent with its COMMIT in one round trip (`write`), or of a
transaction of its own for a call that failed or was refused (`write_alone`). `request_id` is the
call's id (kdbl_api.request_meta: the one in the X-Request-Id header, the log line and the result's
meta); NULL for a download, which the front door does not see.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

from kdbl_api import request_meta
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.async_pool import AsyncPool, Connection

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AuditFacts:
    """What the audit row says a call did. `mode` (the retrieval mode a search used) feeds /capacity's
    latency per mode, not the row."""

    status: str = "ok"  # one of STATUSES
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
    """The row's columns (record_and_commit bounds and stores them)."""
    client = request.client if request is not None else None
    meta = request_meta.of_scope(request.scope) if request is not None else None
    return {
        "tenant_id": principal.tenant_id, "principal": principal.subject, "token_id": principal.token_id,
        "tool": tool, "arguments": arguments if isinstance(arguments, dict) else {},
        "source_ids": facts.source_ids, "keys": facts.keys, "row_count": facts.row_count,
        "status": facts.status, "error": facts.error, "client_ip": client.host if client else None,
        "duration_ms": (time.perf_counter() - started) * 1000,
        "request_id": meta.request_id if meta is not None else None,
    }


async def write(conn: Connection, row: dict[str, Any]) -> None:
    """The row, as the call's transaction's last statement: it is sent with the COMMIT in one round trip
    (it commits with what the call read)."""
    await record_and_commit(conn, **row)


async def write_alone(pool: AsyncPool, principal: Principal, row: dict[str, Any], *,
                      must: bool = False) -> None:
    """The row in its own transaction (a refused or failed call; a download). Unless `must` (a download
    is not served unaudited), a failed write is logged, not raised: the caller's answer to a refusal
    must not turn into an audit failure."""
    try:
        async with rls_transaction(pool, principal) as conn:
            await record_and_commit(conn, **row)
    except Exception:
        if must:
            raise
        log.exception("audit write failed", extra={"tool": row["tool"], "status": row["status"]})


STATUSES = ("ok", "error", "denied", "rate_limited", "timeout", "unauthenticated")

_INSERT = """
INSERT INTO audit (tenant_id, principal, token_id, tool, arguments, source_ids, keys, row_count, status,
                   error, client_ip, duration_ms, request_id)
VALUES (%(tenant_id)s, %(principal)s, %(token_id)s, %(tool)s, CAST(%(arguments)s AS jsonb), CAST(%(source_ids)s AS uuid[]),
        %(keys)s, %(row_count)s, %(status)s, %(error)s, %(client_ip)s, %(duration_ms)s, %(request_id)s)
"""


async def record_and_commit(
    conn: Connection,
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
    request_id: str | None = None,
) -> None:
    """Insert the row and COMMIT the transaction in one round trip (psycopg pipeline: INSERT, COMMIT,
    one Sync). The row is the last statement of every unit of work it audits, so a call's transaction
    ends with it; a failed INSERT fails the COMMIT too. Before, the INSERT and the COMMIT were two round
    trips: one search_content from POST /mcp was 7 round trips, now 6 (tests/integration/test_search_pipeline.py)."""
    params = {
        "tenant_id": tenant_id, "principal": principal, "token_id": token_id,
        "tool": storable(tool[:200]),
        "arguments": arguments_json(arguments), "source_ids": sorted(set(source_ids)),
        "keys": list(dict.fromkeys(keys))[:1000], "row_count": row_count, "status": status,
        "error": (error or None) and storable(error[:2000]), "client_ip": client_ip,
        "duration_ms": duration_ms, "request_id": request_id,
    }
    # COMMIT as a statement of the pipeline, not conn.commit(): that syncs (waits) on its own, and the
    # pipeline's exit then sends a second, empty Sync, so it would still be two round trips. psycopg
    # reads the transaction state from libpq, so the connection block's exit finds nothing to commit.
    async with conn.pipeline():
        await conn.execute(_INSERT, params)
        await conn.execute("COMMIT")


# The `arguments` column's bound. Cutting the JSON text at 20,000 characters (as this did) left invalid
# JSON that CAST(... AS jsonb) refused, failing valid calls (`path: "☃"×3500` is 21,000 characters once
# \u-escaped); NUL and lone surrogates, which jsonb cannot hold, failed the audit of the very refusal
# that named them. Now the row keeps valid JSON: each string at most 2,000 characters, NUL and lone
# surrogates as U+FFFD, and past 20,000 characters a marker with the JSON's head.
ARGUMENTS_MAX_CHARS = 20_000
_STRING_MAX_CHARS = 2_000
_SURROGATES = re.compile("[\ud800-\udfff]")


def storable(text: str) -> str:
    """`text` as PostgreSQL text/jsonb can store it: NUL and lone surrogates become U+FFFD."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        text = _SURROGATES.sub("\ufffd", text)
    return text


def _clean(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return storable(value[:_STRING_MAX_CHARS])
    if depth > 8:
        return "…"
    if isinstance(value, dict):
        return {storable(str(k)[:200]): _clean(v, depth + 1) for k, v in list(value.items())[:100]}
    if isinstance(value, (list, tuple)):
        return [_clean(v, depth + 1) for v in value[:100]]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return storable(str(value)[:_STRING_MAX_CHARS])


def arguments_json(arguments: dict[str, Any]) -> str:
    """The call's arguments as JSON jsonb accepts, at most ~ARGUMENTS_MAX_CHARS characters."""
    text = json.dumps(arguments, default=str, ensure_ascii=False)
    plain = text.isascii() or not _SURROGATES.search(text)
    if len(text) <= ARGUMENTS_MAX_CHARS and "\\u0000" not in text and plain:
        return text  # the common case: one dumps, no copy
    text = json.dumps(_clean(arguments), ensure_ascii=False)
    if len(text) > ARGUMENTS_MAX_CHARS:
        text = json.dumps({"truncated": True, "chars": len(text), "head": text[:_STRING_MAX_CHARS]},
                          ensure_ascii=False)
    return text

