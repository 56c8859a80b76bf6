"""Administration on the owner connection: tenants, sources, tokens, grants, audit listing.

The owner role passes row-level security through the kdbl_admin policies; rows an operator
manages (managed_by='operator') are refused without force=True.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from psycopg import errors as pg_errors
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from kdbl_core import sources
from kdbl_core.access import policy, share_acl, tokens
from kdbl_core.access.principal import ALL_SCOPES
from kdbl_core.db.connect import Pool
from kdbl_core.errors import Conflict, InvalidArgument, NotFound
from kdbl_core.sources import relabel

_TENANT = "SELECT * FROM tenants WHERE name = %s"


def _tenant(conn: Any, name: str, *, lock: bool = False) -> Any:
    tenant = conn.execute(_TENANT + (" FOR UPDATE" if lock else ""), (name,)).fetchone()
    if tenant is None:
        raise NotFound(f"no tenant named '{name}'")
    return tenant


def _guard(row: Any | None, force: bool) -> None:
    if row is not None and row.managed_by == "operator" and not force:
        raise Conflict(f"'{row.name}' is managed by the kdbl operator (edit its custom resource, or use --force)")


def create_tenant(db: Pool, name: str, *, display_name: str | None = None, hybrid: bool = True,
                  exist_ok: bool = False) -> Any:
    """The new tenant's row (attribute access: `.id`, `.name`, ...)."""
    with db.connection() as conn:
        existing = conn.execute(_TENANT, (name,)).fetchone()
        if existing is not None:
            if exist_ok:
                return existing
            raise Conflict(f"tenant '{name}' already exists")
        try:
            return conn.execute(
                "INSERT INTO tenants (name, display_name, hybrid_enabled) VALUES (%s, %s, %s) RETURNING *",
                (name, display_name, hybrid)).fetchone()
        except pg_errors.IntegrityError as exc:
            raise InvalidArgument("name", "use 1-63 lower-case letters, digits and '-'") from exc


def _dicts(db: Pool, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql, params).fetchall()


def list_tenants(db: Pool) -> list[dict[str, Any]]:
    return _dicts(db, """
        SELECT t.name, t.display_name, t.hybrid_enabled, t.managed_by, t.created_at,
               (SELECT count(*) FROM sources s WHERE s.tenant_id = t.id) AS sources,
               (SELECT count(*) FROM files f WHERE f.tenant_id = t.id) AS files
          FROM tenants t ORDER BY t.name""")


def show_tenant(db: Pool, name: str) -> dict[str, Any]:
    """The tenant's effective policy (defaults filled in), as the API, worker and CLI apply it."""
    from kdbl_core.settings import get_settings

    with db.connection() as conn:
        tenant = _tenant(conn, name)
    defaults = get_settings()
    effective = policy.parse(tenant.settings, default_per_minute=defaults.rate_limit_per_minute,
                             default_burst=defaults.rate_limit_burst, default_limits=policy.Limits.of(defaults))
    return {"name": tenant.name, "display_name": tenant.display_name, "managed_by": tenant.managed_by,
            "hybrid_enabled": tenant.hybrid_enabled, **effective.describe()}


def update_tenant(db: Pool, name: str, *, enabled: bool | None = None, tools: str | None = None,
                  modes: str | None = None, rate_limit: str | None = None, tenant_rate_limit: str | None = None,
                  downloads: str | None = None, max_in_flight: str | None = None, queue_ms: str | None = None,
                  timeout: str | None = None, force: bool = False) -> dict[str, Any]:
    """Change a tenant's policy (for installs without the operator); running APIs apply it within ~2 s.
    `max_in_flight`, `queue_ms`: a number or 'default'; `timeout`: policy.parse_deadlines' syntax."""
    limits: dict[str, Any] = {}
    if max_in_flight is not None:
        limits["max_in_flight"] = policy.parse_count(max_in_flight, policy.IN_FLIGHT_RANGE, "max-in-flight")
    if queue_ms is not None:
        limits["queue_ms"] = policy.parse_count(queue_ms, policy.QUEUE_MS_RANGE, "queue-ms")
    if timeout is not None:
        limits["deadlines"] = policy.parse_deadlines(timeout)
    with db.connection() as conn:
        tenant = _tenant(conn, name, lock=True)
        _guard(tenant, force)
        settings = policy.apply_update(
            tenant.settings or {}, enabled=enabled,
            tools=policy.parse_list(tools, policy.ALL_TOOLS, "tools") if tools is not None else None,
            modes=policy.parse_list(modes, policy.MODES, "modes") if modes is not None else None,
            rate=policy.parse_rate(rate_limit) if rate_limit is not None else None,
            tenant_rate=policy.parse_rate(tenant_rate_limit, "tenant-rate-limit")
            if tenant_rate_limit is not None else None,
            downloads=downloads, **limits)
        conn.execute("UPDATE tenants SET settings = %s, updated_at = now() WHERE id = %s",
                     (Jsonb(settings), tenant.id))
    return show_tenant(db, name)


def add_source(db: Pool, tenant_name: str, *, protocol: str, config: dict[str, Any], name: str | None,
               restricted: bool = False, hybrid: bool = True, exist_ok: bool = False,
               schedule: str | None = None, force: bool = False, permissions: str | None = None,
               permission_map: dict[str, str] | None = None) -> Any:
    """`permissions`: tenant | grants | from-source (kdbl_core.access.share_acl; default: grants when
    `restricted`, else tenant); `permission_map`: ids and SIDs to principals for from-source."""
    mode = share_acl.acl_mode(permissions or ("grants" if restricted else "tenant"), protocol)
    names = _permission_map(permission_map)
    if protocol == "fs":
        root = Path(config["root"]).expanduser().resolve()
        if not root.is_dir():
            raise InvalidArgument("path", f"{root} is not a directory")
        config = {**config, "root": str(root)}
        name = name or root.name or "root"
    elif protocol == "s3":
        name = name or config.get("bucket")
    elif protocol == "smb":
        name = name or config.get("share")
    elif protocol in ("webdav", "http"):
        name = name or (config.get("url") or "").rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise InvalidArgument("name", "a source needs a name")
    with db.connection() as conn:
        tenant = _tenant(conn, tenant_name)
        existing = conn.execute("SELECT * FROM sources WHERE tenant_id = %s AND name = %s",
                                (tenant.id, name)).fetchone()
        if existing is not None:
            if exist_ok and existing.config == config and existing.protocol == protocol:
                return existing
            raise Conflict(f"tenant '{tenant_name}' already has a source named '{name}' (pick --name)")
        _guard(tenant, force)
        return conn.execute(
            "INSERT INTO sources (tenant_id, name, protocol, config, acl_mode, hybrid_enabled, schedule, "
            "permission_map) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (tenant.id, name, protocol, Jsonb(config), mode, hybrid, schedule, Jsonb(names))).fetchone()


def _permission_map(names: dict[str, str] | None) -> dict[str, str]:
    share_acl.PrincipalMap(dict(names or {}), host_names=False)  # ConfigError naming the bad entry
    return dict(names or {})


def set_source_permissions(db: Pool, source_id: uuid.UUID, permissions: str, *,
                           permission_map: dict[str, str] | None = None, checks: str | None = None,
                           force: bool = False) -> dict[str, Any]:
    """Switch who may read a source's files. Leaving from-source clears its files' permission sets in the
    same statement (a trigger: nothing stays readable by rules the source no longer uses); entering it, each
    file is readable by its share's permissions from the next crawl on — until then by grants alone (closed).
    `checks` (smb): the config's permission_checks (kdbl_core.sources.config)."""
    with db.connection() as conn:
        source = conn.execute("SELECT * FROM sources WHERE id = %s FOR UPDATE", (source_id,)).fetchone()
        if source is None:
            raise NotFound(f"no source {source_id}")
        _guard(source, force)
        mode = share_acl.acl_mode(permissions, source.protocol)
        names = source.permission_map if permission_map is None else _permission_map(permission_map)
        if checks is not None:
            config = sources.build(source.protocol, **{**source.config, "permission_checks": checks}).stored
            conn.execute("UPDATE sources SET config = %s WHERE id = %s", (Jsonb(config), source_id))
        [cleared] = conn.execute("SELECT count(permission_set) FROM files WHERE source_id = %s AND %s <> 'source'",
                                 (source_id, mode)).fetchone()
        # leaving from-source, a trigger clears the files' sets (migration 0023: whoever changes the mode)
        conn.execute("UPDATE sources SET acl_mode = %s, permission_map = %s, updated_at = now() WHERE id = %s",
                     (mode, Jsonb(names), source_id))
    return {"id": source_id, "permissions": permissions, "acl_mode": mode, "permission_map": names,
            "files_cleared": cleared,
            "note": ("the share's permissions apply from the next crawl (kdbl-control crawl --source ...)"
                     if mode == "source" and source.acl_mode != "source" else None)}


def set_source_entities(db: Pool, source_id: uuid.UUID, on: bool, *, force: bool = False) -> dict[str, Any]:
    """Switch a source's named entities (config `entities`): on, the worker reads every file's entities
    behind the crawl; off, row-level security hides them at once and the worker deletes them."""
    from kdbl_core.content import entity_store

    with db.connection() as conn:
        source = conn.execute("SELECT * FROM sources WHERE id = %s FOR UPDATE", (source_id,)).fetchone()
        if source is None:
            raise NotFound(f"no source {source_id}")
        _guard(source, force)
        config = sources.build(source.protocol, **{**source.config, "entities": on or None}).stored
        conn.execute("UPDATE sources SET config = %s, updated_at = now() WHERE id = %s", (Jsonb(config), source_id))
        waiting = entity_store.pending_files(conn, source_id) if on else 0
    return {"id": source_id, "entities": on, "files_to_read": waiting,
            "note": "the worker reads them behind the crawl (kdbl-control crawl reads them too)" if on else None}


def update_source_labels(db: Pool, source_id: uuid.UUID, *, labels: list[str] | None = None,
                         label_globs: dict[str, list[str]] | None = None, object_tags: bool | None = None,
                         force: bool = False) -> dict[str, Any]:
    """Change a source's `labels`, `label_globs` or (s3) `object_tags` (None keeps one; [] / {} / False
    removes it) and relabel its files in the same transaction (kdbl_core.sources.relabel). Returns the
    new label config with the relabel's counts."""
    with db.connection() as conn:
        source = conn.execute("SELECT * FROM sources WHERE id = %s FOR UPDATE", (source_id,)).fetchone()
        if source is None:
            raise NotFound(f"no source {source_id}")
        _guard(source, force)
        if object_tags and source.protocol != "s3":
            raise InvalidArgument("object-tags", "only protocol s3 has object tags")
        config = dict(source.config)
        for key, value in (("labels", labels), ("label_globs", label_globs), ("object_tags", object_tags)):
            if value is not None:
                config.pop(key, None)
                if value not in ([], {}, False):
                    config[key] = value
        sources.parse(source.protocol, config)  # InvalidArgument names `labels` / `label_globs`
        conn.execute("UPDATE sources SET config = %s, updated_at = now() WHERE id = %s", (Jsonb(config), source_id))
        done = relabel.apply_config_change(conn, source_id, source.config, config)
    return {"id": source_id, "labels": config.get("labels", []), "label_globs": config.get("label_globs", {}),
            "object_tags": bool(config.get("object_tags")), "files": done.files if done else 0,
            "relabelled": done.changed if done else 0}


def list_sources(db: Pool, tenant_name: str | None = None) -> list[dict[str, Any]]:
    sql = """
        SELECT s.id, t.name AS tenant, s.name, s.protocol, s.enabled, s.hybrid_enabled, s.acl_mode,
               s.managed_by, s.last_indexed_at, s.config,
               (SELECT count(*) FROM files f WHERE f.source_id = s.id) AS files,
               -- the latest crawl run: its state, why it failed, and quota problems (kdbl_worker.pipeline)
               (SELECT j.state || coalesce(': ' || j.last_error, '')
                       || coalesce((SELECT ': ' || string_agg(p ->> 1, '; ') FROM jsonb_array_elements(j.problems) p
                                     WHERE p ->> 0 = 'quota'), '')
                  FROM crawl_jobs j WHERE j.source_id = s.id ORDER BY j.created_at DESC, j.id DESC LIMIT 1)
                 AS last_run
          FROM sources s JOIN tenants t ON t.id = s.tenant_id"""
    params: dict[str, Any] = {}
    if tenant_name:
        sql += " WHERE t.name = %(tenant)s"
        params["tenant"] = tenant_name
    return _dicts(db, sql + " ORDER BY t.name, s.name", params)


def create_token(db: Pool, *, tenant_name: str | None, name: str, scopes: list[str] | None = None,
                 subject: str | None = None, groups: list[str] | None = None,
                 expires_at: datetime | None = None, admin: bool = False) -> tuple[str, Any]:
    scopes = scopes or list(ALL_SCOPES)
    for scope in scopes:
        if scope not in ALL_SCOPES:
            raise InvalidArgument("scope", f"unknown scope '{scope}' (known: {', '.join(ALL_SCOPES)})")
    new = tokens.generate(admin=admin)
    with db.connection() as conn:
        tenant_id = None if admin else _tenant(conn, tenant_name or "").id
        token = conn.execute(
            "INSERT INTO tokens (lookup_id, tenant_id, kind, name, subject, groups, scopes, hash, fingerprint, "
            "expires_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING *",
            (new.lookup_id, tenant_id, "admin" if admin else "tenant", name, subject or f"user:{name}",
             groups or [], [] if admin else scopes, new.hash, new.fingerprint, expires_at)).fetchone()
    return new.token, token


def list_tokens(db: Pool, tenant_name: str | None = None) -> list[dict[str, Any]]:
    sql = """SELECT k.id, k.lookup_id, coalesce(t.name, '(cluster admin)') AS tenant, k.name, k.subject,
                    k.groups, k.scopes, k.created_at, k.expires_at, k.revoked_at
               FROM tokens k LEFT JOIN tenants t ON t.id = k.tenant_id"""
    params: dict[str, Any] = {}
    if tenant_name:
        sql += " WHERE t.name = %(tenant)s"
        params["tenant"] = tenant_name
    return _dicts(db, sql + " ORDER BY k.created_at", params)


def revoke_token(db: Pool, ident: str, *, force: bool = False) -> int:
    """Revoke by token id, lookup id, or the token itself."""
    lookup = tokens.parse(ident).lookup_id if tokens.looks_like_pat(ident) else ident
    try:
        as_uuid: uuid.UUID | None = uuid.UUID(ident)
    except ValueError:
        as_uuid = None
    match = "revoked_at IS NULL AND (lookup_id = %(lookup)s OR id = %(id)s)"
    params = {"lookup": lookup, "id": as_uuid}
    with db.connection() as conn:
        for token in conn.execute(f"SELECT name, managed_by FROM tokens WHERE {match}", params):
            _guard(token, force)
        count = conn.execute(f"UPDATE tokens SET revoked_at = now() WHERE {match}", params).rowcount
    if count == 0:
        raise NotFound(f"no active token matches '{ident}'")
    return count


def _source(conn: Any, source_id: uuid.UUID | None) -> Any:
    return conn.execute("SELECT * FROM sources WHERE id = %s", (source_id,)).fetchone()


def add_grant(db: Pool, *, source_id: uuid.UUID, subject: str, file_key: str | None = None,
              force: bool = False) -> Any:
    if not subject.startswith(("user:", "group:")) or subject.endswith(":"):
        raise InvalidArgument("subject", "use user:<name> or group:<name>")
    with db.connection() as conn:
        source = _source(conn, source_id)
        if source is None:
            raise NotFound(f"no source {source_id}")
        if file_key is None:  # the operator manages whole-source grants; per-file grants stay free
            _guard(source, force)
        try:
            return conn.execute(
                "INSERT INTO grants (tenant_id, source_id, file_key, subject) VALUES (%s, %s, %s, %s) RETURNING *",
                (source.tenant_id, source_id, file_key, subject)).fetchone()
        except pg_errors.IntegrityError:
            raise Conflict("that grant already exists") from None


def set_source_acl(db: Pool, source_id: uuid.UUID, *, restricted: bool, force: bool = False) -> None:
    set_source_permissions(db, source_id, "grants" if restricted else "tenant", force=force)


def list_grants(db: Pool, source_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    where = " WHERE source_id = %(source)s" if source_id else ""
    return _dicts(db, f"SELECT id, source_id, file_key, subject FROM grants{where} ORDER BY id",
                  {"source": source_id})


def revoke_grant(db: Pool, grant_id: int, *, force: bool = False) -> None:
    with db.connection() as conn:
        grant = conn.execute("SELECT * FROM grants WHERE id = %s", (grant_id,)).fetchone()
        if grant is None:
            raise NotFound(f"no grant {grant_id}")
        if grant.file_key is None:
            _guard(_source(conn, grant.source_id), force)
        conn.execute("DELETE FROM grants WHERE id = %s", (grant_id,))


def audit_rows(db: Pool, *, tool: str | None = None, tenant_name: str | None = None,
               status: str | None = None, principal: str | None = None, since: datetime | None = None,
               until: datetime | None = None, request_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Newest first; every filter optional. `principal` matches 'user:NAME' or plain NAME; `request_id`
    finds the row of one call (the id its client saw in X-Request-Id and meta.request_id)."""
    where: list[str] = []
    params: dict[str, Any] = {"limit": limit}
    with db.connection() as conn:
        if tool:
            where.append("tool = %(tool)s")
            params["tool"] = tool
        if tenant_name:
            where.append("tenant_id = %(tenant)s")
            params["tenant"] = _tenant(conn, tenant_name).id
        if status:
            where.append("status = %(status)s")
            params["status"] = status
        if principal:
            where.append("principal = ANY(%(names)s)")
            params["names"] = [principal] if ":" in principal else [principal, f"user:{principal}"]
        if since:
            where.append("ts >= %(since)s")
            params["since"] = since
        if until:
            where.append("ts < %(until)s")
            params["until"] = until
        if request_id:
            where.append("request_id = %(request_id)s")
            params["request_id"] = request_id
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(
                "SELECT ts, principal, tool, arguments, source_ids, row_count, status, error, client_ip, keys, "
                f"duration_ms, request_id FROM audit{clause} ORDER BY id DESC LIMIT %(limit)s", params).fetchall()
    for row in rows:
        row["source_ids"] = [str(s) for s in row["source_ids"]]
    return rows
