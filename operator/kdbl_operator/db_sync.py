"""The SQL the Kubernetes operator converges rows with (owner role, through the kdbl_admin policies).

Small statements on a Connection the caller holds, so one reconcile is one transaction: the operator
reads the current rows (locking them), lets its pure planner decide, and writes only what differs.
Deletion runs in bounded batches, each its own transaction, so a large tenant is removed without one
huge transaction and a restarted operator simply continues with what is left.

Database errors surface as kdbl_core.errors.TemporaryError (worth a retry: connection lost, lock
timeout, a concurrent insert of the same name) so callers need not know the driver's errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kdbl_core.content import store
from kdbl_core.db.connect import Connection, Pool
from kdbl_core.errors import TemporaryError

OPERATOR = "operator"
BOOTSTRAP_TOKEN_NAME = "bootstrap"

_TENANT_COLUMNS = ("display_name", "hybrid_enabled", "settings", "managed_by")
_SOURCE_COLUMNS = ("protocol", "config", "enabled", "hybrid_enabled", "acl_mode", "permission_map", "schedule",
                   "managed_by")
_JSON_COLUMNS = {"settings", "config", "permission_map"}


@contextmanager
def transaction(pool: Pool) -> Iterator[Connection]:
    """One transaction; connection failures and serialisation problems become TemporaryError."""
    try:
        with pool.connection() as conn:
            conn.execute("SET LOCAL lock_timeout = '10s'")
            yield conn
    except psycopg.IntegrityError as exc:
        # Two reconciles inserted the same name at once: the next attempt sees the winner's row.
        raise TemporaryError(f"concurrent change in the database ({type(exc).__name__})") from exc
    except psycopg.OperationalError as exc:
        # connection refused/lost (and the pool's timeout), lock timeout, deadlock, serialisation failure
        first = (str(exc).strip().splitlines() or [""])[0]
        raise TemporaryError(f"database unavailable: {first or type(exc).__name__}") from exc


def _json(values: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters with the JSON columns' values wrapped for jsonb."""
    return {c: Jsonb(v) if c in _JSON_COLUMNS else v for c, v in values.items()}


def _set_clause(changes: Mapping[str, Any], allowed: Iterable[str]) -> str:
    allowed = set(allowed)
    unknown = set(changes) - allowed
    if unknown:
        raise ValueError(f"not a converged column: {', '.join(sorted(unknown))}")
    return ", ".join(f"{c} = %({c})s" for c in sorted(changes))


def _dict(conn: Connection, sql: str, params: Mapping[str, Any]) -> dict[str, Any] | None:
    return conn.cursor(row_factory=dict_row).execute(sql, params).fetchone()


# ------------------------------------------------------------------------------------------------
# tenants
# ------------------------------------------------------------------------------------------------
def tenant_by_name(conn: Connection, name: str, *, lock: bool = False) -> dict[str, Any] | None:
    sql = ("SELECT id, name, display_name, hybrid_enabled, managed_by, settings FROM tenants WHERE name = %(name)s"
           + (" FOR UPDATE" if lock else ""))
    return _dict(conn, sql, {"name": name})


def insert_tenant(conn: Connection, name: str, values: Mapping[str, Any]) -> uuid.UUID:
    sql = ("INSERT INTO tenants (name, display_name, hybrid_enabled, settings, managed_by) "
           "VALUES (%(name)s, %(display_name)s, %(hybrid_enabled)s, %(settings)s, %(managed_by)s) RETURNING id")
    return conn.execute(sql, _json({"name": name, **{c: values[c] for c in _TENANT_COLUMNS}})).fetchone().id


def update_tenant(conn: Connection, tenant_id: uuid.UUID, changes: Mapping[str, Any]) -> None:
    if not changes:
        return
    clause = _set_clause(changes, _TENANT_COLUMNS)
    conn.execute(f"UPDATE tenants SET {clause}, updated_at = now() WHERE id = %(id)s", _json({**changes, "id": tenant_id}))


def sync_inherited_hybrid(conn: Connection, tenant_id: uuid.UUID, hybrid: bool) -> int:
    """Operator sources that inherit the tenant's hybrid toggle follow it."""
    return conn.execute("""
        UPDATE sources SET hybrid_enabled = %(h)s, updated_at = now()
         WHERE tenant_id = %(t)s AND managed_by = 'operator' AND config -> 'k8s' ->> 'hybrid' = 'inherit'
           AND hybrid_enabled IS DISTINCT FROM %(h)s""", {"t": tenant_id, "h": hybrid}).rowcount


def tenant_counts(conn: Connection, tenant_id: uuid.UUID) -> dict[str, int]:
    row = conn.execute("""
        SELECT (SELECT count(*) FROM sources WHERE tenant_id = %(t)s) AS sources,
               (SELECT count(*) FROM files WHERE tenant_id = %(t)s) AS files,
               (SELECT coalesce(sum(chunk_count), 0) FROM files WHERE tenant_id = %(t)s) AS chunks,
               (SELECT count(*) FROM tokens WHERE tenant_id = %(t)s AND revoked_at IS NULL
                   AND (expires_at IS NULL OR expires_at > now())) AS active_tokens""", {"t": tenant_id}).fetchone()
    return {"sources": int(row.sources), "files": int(row.files), "chunks": int(row.chunks),
            "activeTokens": int(row.active_tokens)}


# ------------------------------------------------------------------------------------------------
# sources and grants
# ------------------------------------------------------------------------------------------------
def source_by_name(conn: Connection, tenant_id: uuid.UUID, name: str, *, lock: bool = False) -> dict[str, Any] | None:
    sql = ("SELECT id, tenant_id, name, protocol, config, enabled, hybrid_enabled, acl_mode, permission_map, schedule, "
           "managed_by FROM sources WHERE tenant_id = %(t)s AND name = %(name)s" + (" FOR UPDATE" if lock else ""))
    return _dict(conn, sql, {"t": tenant_id, "name": name})


def source_by_owner(conn: Connection, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    """The operator-managed source written for one Source resource (for deletion after a tenant rename)."""
    return _dict(conn, """
        SELECT id, tenant_id, name, config, managed_by FROM sources
         WHERE managed_by = 'operator' AND config -> 'k8s' -> 'owner' ->> 'kind' = %(kind)s
           AND coalesce(config -> 'k8s' -> 'owner' ->> 'namespace', '') = %(ns)s
           AND config -> 'k8s' -> 'owner' ->> 'name' = %(name)s
         ORDER BY created_at LIMIT 1""", {"kind": kind, "ns": namespace, "name": name})


def insert_source(conn: Connection, tenant_id: uuid.UUID, name: str, values: Mapping[str, Any]) -> uuid.UUID:
    sql = ("INSERT INTO sources (tenant_id, name, protocol, config, enabled, hybrid_enabled, acl_mode, "
           "permission_map, schedule, managed_by) VALUES (%(t)s, %(name)s, %(protocol)s, %(config)s, %(enabled)s, "
           "%(hybrid_enabled)s, %(acl_mode)s, %(permission_map)s, %(schedule)s, %(managed_by)s) RETURNING id")
    return conn.execute(sql, _json({"t": tenant_id, "name": name, **{c: values[c] for c in _SOURCE_COLUMNS}})).fetchone().id


def rename_source(conn: Connection, source_id: uuid.UUID, name: str) -> None:
    conn.execute("UPDATE sources SET name = %(name)s, updated_at = now() WHERE id = %(id)s",
                 {"id": source_id, "name": name})


def update_source(conn: Connection, source_id: uuid.UUID, changes: Mapping[str, Any]) -> None:
    """The columns that differ. acl_mode leaving 'source' clears the files' permission sets in the same
    statement (a trigger of migration 0023, whoever changes the mode)."""
    if not changes:
        return
    clause = _set_clause(changes, _SOURCE_COLUMNS)
    conn.execute(f"UPDATE sources SET {clause}, updated_at = now() WHERE id = %(id)s", _json({**changes, "id": source_id}))


def source_grants(conn: Connection, source_id: uuid.UUID) -> set[str]:
    """Whole-source grants (per-file grants are not the operator's business)."""
    rows = conn.execute("SELECT subject FROM grants WHERE source_id = %(s)s AND file_key IS NULL", {"s": source_id})
    return {r.subject for r in rows}


def change_grants(conn: Connection, tenant_id: uuid.UUID, source_id: uuid.UUID, *, add: Iterable[str],
                  remove: Iterable[str]) -> None:
    add, remove = list(add), list(remove)
    if add:
        conn.cursor().executemany("INSERT INTO grants (tenant_id, source_id, file_key, subject) "
                                  "VALUES (%(t)s, %(s)s, NULL, %(subject)s) ON CONFLICT DO NOTHING",
                                  [{"t": tenant_id, "s": source_id, "subject": s} for s in add])
    if remove:
        conn.execute("DELETE FROM grants WHERE source_id = %(s)s AND file_key IS NULL AND subject = ANY(%(subs)s)",
                     {"s": source_id, "subs": remove})


def source_counts(conn: Connection, source_id: uuid.UUID) -> dict[str, Any]:
    row = conn.execute("""
        SELECT (SELECT count(*) FROM files WHERE source_id = %(s)s) AS files,
               (SELECT count(*) FROM files WHERE source_id = %(s)s AND status = 'failed') AS failed,
               (SELECT count(*) FROM chunks WHERE source_id = %(s)s) AS chunks,
               (SELECT count(*) FROM chunks WHERE source_id = %(s)s AND embedding IS NOT NULL) AS embedded,
               (SELECT last_indexed_at FROM sources WHERE id = %(s)s) AS last_indexed_at""", {"s": source_id}).fetchone()
    return {"files": int(row.files), "failed_files": int(row.failed), "chunks": int(row.chunks),
            "embedded_chunks": int(row.embedded), "last_indexed_at": row.last_indexed_at}


# ------------------------------------------------------------------------------------------------
# bootstrap tokens (only hashes: the plaintext lives in the Kubernetes Secret alone)
# ------------------------------------------------------------------------------------------------
def bootstrap_tokens(conn: Connection, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    rows = conn.cursor(row_factory=dict_row).execute("""
        SELECT id, lookup_id, subject, groups, scopes FROM tokens
         WHERE tenant_id = %(t)s AND managed_by = 'operator' AND name = %(n)s AND revoked_at IS NULL
         ORDER BY created_at""", {"t": tenant_id, "n": BOOTSTRAP_TOKEN_NAME})
    return rows.fetchall()


def insert_bootstrap_token(conn: Connection, tenant_id: uuid.UUID, *, lookup_id: str, token_hash: str,
                           fingerprint: bytes | None, subject: str, groups: list[str], scopes: list[str]) -> uuid.UUID:
    return conn.execute("""
        INSERT INTO tokens (lookup_id, tenant_id, kind, name, subject, groups, scopes, hash, fingerprint, managed_by)
        VALUES (%(lookup)s, %(t)s, 'tenant', %(n)s, %(subject)s, %(groups)s, %(scopes)s, %(hash)s, %(fp)s, 'operator') RETURNING id""",
        {"lookup": lookup_id, "t": tenant_id, "n": BOOTSTRAP_TOKEN_NAME, "subject": subject, "groups": groups,
         "scopes": scopes, "hash": token_hash, "fp": fingerprint}).fetchone().id


def update_token_grants(conn: Connection, token_id: uuid.UUID, *, subject: str, groups: list[str],
                        scopes: list[str]) -> bool:
    return conn.execute("""
        UPDATE tokens SET subject = %(subject)s, groups = %(groups)s, scopes = %(scopes)s
         WHERE id = %(id)s AND (subject, groups, scopes) IS DISTINCT FROM (%(subject)s, %(groups)s, %(scopes)s)""",
        {"id": token_id, "subject": subject, "groups": groups, "scopes": scopes}).rowcount > 0


def revoke_bootstrap_tokens(conn: Connection, tenant_id: uuid.UUID, lookup_ids: Iterable[str]) -> int:
    ids = list(lookup_ids)
    if not ids:
        return 0
    return conn.execute("""
        UPDATE tokens SET revoked_at = now()
         WHERE tenant_id = %(t)s AND managed_by = 'operator' AND name = %(n)s AND revoked_at IS NULL
           AND lookup_id = ANY(%(ids)s)""", {"t": tenant_id, "n": BOOTSTRAP_TOKEN_NAME, "ids": ids}).rowcount


# ------------------------------------------------------------------------------------------------
# deletion in bounded batches (each call is one transaction; call until it returns 0)
# ------------------------------------------------------------------------------------------------
def delete_source_files(conn: Connection, tenant_id: uuid.UUID, source_id: uuid.UUID, limit: int) -> int:
    """Delete up to `limit` files of a source with their chunks and postings, keeping BM25 statistics exact."""
    # members go with their parent (store.delete_files)
    keys = [r.key for r in conn.execute("SELECT key FROM files WHERE source_id = %(s)s AND parent_id IS NULL "
                                        "ORDER BY id LIMIT %(n)s", {"s": source_id, "n": limit})]
    return store.delete_files(conn, tenant_id, source_id, keys) if keys else 0


def remaining_files(conn: Connection, *, source_id: uuid.UUID | None = None, tenant_id: uuid.UUID | None = None) -> int:
    if source_id is not None:
        return int(conn.execute("SELECT count(*) FROM files WHERE source_id = %(s)s", {"s": source_id}).fetchone()[0])
    return int(conn.execute("SELECT count(*) FROM files WHERE tenant_id = %(t)s", {"t": tenant_id}).fetchone()[0])


def delete_source(conn: Connection, source_id: uuid.UUID) -> None:
    """The source row itself (its grants cascade); call once its files are gone."""
    conn.execute("DELETE FROM sources WHERE id = %(s)s", {"s": source_id})


def delete_tenant_batch(conn: Connection, tenant_id: uuid.UUID, limit: int) -> int:
    """Delete up to `limit` rows of a tenant's bulk data (files with their chunks and postings, then term
    statistics, then audit rows). Statistics are not maintained: the whole tenant goes."""
    ids = [r.id for r in conn.execute("SELECT id FROM files WHERE tenant_id = %(t)s ORDER BY id LIMIT %(n)s",
                                      {"t": tenant_id, "n": limit})]
    if ids:
        conn.execute("DELETE FROM postings WHERE tenant_id = %(t)s AND file_id = ANY(%(ids)s)", {"t": tenant_id, "ids": ids})
        conn.execute("DELETE FROM chunks WHERE file_id = ANY(%(ids)s)", {"ids": ids})
        conn.execute("DELETE FROM files WHERE id = ANY(%(ids)s)", {"ids": ids})
        return len(ids)
    n = conn.execute("""
        DELETE FROM term_stats WHERE tenant_id = %(t)s AND (term, shard) IN
            (SELECT term, shard FROM term_stats WHERE tenant_id = %(t)s LIMIT %(n)s)""",
        {"t": tenant_id, "n": limit}).rowcount
    if n:
        return n
    return conn.execute("DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE tenant_id = %(t)s LIMIT %(n)s)",
                        {"t": tenant_id, "n": limit}).rowcount


def delete_tenant(conn: Connection, tenant_id: uuid.UUID) -> None:
    """The tenant row; sources, grants, tokens and the remaining statistics cascade."""
    conn.execute("DELETE FROM tenants WHERE id = %(t)s", {"t": tenant_id})
