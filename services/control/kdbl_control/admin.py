"""Administration on the owner connection: tenants, sources, tokens, grants, audit listing.

The owner role passes row-level security through the kdbl_admin policies; rows an operator
manages (managed_by='operator') are refused without force=True.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kdbl_core import policy
from kdbl_core.auth import pat
from kdbl_core.db.models import AuditRow, Grant, Source, Tenant, Token
from kdbl_core.errors import Conflict, InvalidArgument, NotFound
from kdbl_core.principal import ALL_SCOPES


def _tenant(session: Session, name: str) -> Tenant:
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise NotFound(f"no tenant named '{name}'")
    return tenant


def _guard(row: Tenant | Source | Token | None, force: bool) -> None:
    if row is not None and row.managed_by == "operator" and not force:
        raise Conflict(f"'{row.name}' is managed by the kdbl operator (edit its custom resource, or use --force)")


def create_tenant(engine: Engine, name: str, *, display_name: str | None = None, hybrid: bool = True,
                  exist_ok: bool = False) -> Tenant:
    with Session(engine) as session, session.begin():
        existing = session.scalar(select(Tenant).where(Tenant.name == name))
        if existing is not None:
            if exist_ok:
                session.expunge(existing)
                return existing
            raise Conflict(f"tenant '{name}' already exists")
        tenant = Tenant(name=name, display_name=display_name, hybrid_enabled=hybrid)
        session.add(tenant)
        try:
            session.flush()
        except IntegrityError as exc:
            raise InvalidArgument("name", "use 1-63 lower-case letters, digits and '-'") from exc
        session.refresh(tenant)
        session.expunge(tenant)
        return tenant


def list_tenants(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT t.name, t.display_name, t.hybrid_enabled, t.managed_by, t.created_at,
                   (SELECT count(*) FROM sources s WHERE s.tenant_id = t.id) AS sources,
                   (SELECT count(*) FROM files f WHERE f.tenant_id = t.id) AS files
              FROM tenants t ORDER BY t.name"""))
        return [dict(r) for r in rows.mappings()]


def show_tenant(engine: Engine, name: str) -> dict[str, Any]:
    """The tenant's effective policy (defaults filled in), as the API, worker and CLI apply it."""
    from kdbl_core.settings import get_settings

    with Session(engine) as session:
        tenant = _tenant(session, name)
        defaults = get_settings()
        effective = policy.parse(tenant.settings, default_per_minute=defaults.rate_limit_per_minute,
                                 default_burst=defaults.rate_limit_burst)
        return {"name": tenant.name, "display_name": tenant.display_name, "managed_by": tenant.managed_by,
                "hybrid_enabled": tenant.hybrid_enabled, **effective.describe()}


def update_tenant(engine: Engine, name: str, *, enabled: bool | None = None, tools: str | None = None,
                  modes: str | None = None, rate_limit: str | None = None, tenant_rate_limit: str | None = None,
                  downloads: str | None = None, force: bool = False) -> dict[str, Any]:
    """Change a tenant's policy (for installs without the operator); running APIs apply it within ~2 s."""
    with Session(engine) as session, session.begin():
        tenant = _tenant(session, name)
        _guard(tenant, force)
        tenant.settings = policy.apply_update(
            tenant.settings or {}, enabled=enabled,
            tools=policy.parse_list(tools, policy.TOOLS, "tools") if tools is not None else None,
            modes=policy.parse_list(modes, policy.MODES, "modes") if modes is not None else None,
            rate=policy.parse_rate(rate_limit) if rate_limit is not None else None,
            tenant_rate=policy.parse_rate(tenant_rate_limit, "tenant-rate-limit")
            if tenant_rate_limit is not None else None,
            downloads=downloads)
        tenant.updated_at = datetime.now(UTC)
    return show_tenant(engine, name)


def add_source(engine: Engine, tenant_name: str, *, protocol: str, config: dict[str, Any], name: str | None,
               restricted: bool = False, hybrid: bool = True, exist_ok: bool = False,
               schedule: str | None = None, force: bool = False) -> Source:
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
    with Session(engine) as session, session.begin():
        tenant = _tenant(session, tenant_name)
        existing = session.scalar(select(Source).where(Source.tenant_id == tenant.id, Source.name == name))
        if existing is not None:
            if exist_ok and existing.config == config and existing.protocol == protocol:
                session.expunge(existing)
                return existing
            raise Conflict(f"tenant '{tenant_name}' already has a source named '{name}' (pick --name)")
        _guard(tenant, force)
        source = Source(tenant_id=tenant.id, name=name, protocol=protocol, config=config,
                        acl_mode="restricted" if restricted else "tenant", hybrid_enabled=hybrid,
                        schedule=schedule)
        session.add(source)
        session.flush()
        session.refresh(source)
        session.expunge(source)
        return source


def list_sources(engine: Engine, tenant_name: str | None = None) -> list[dict[str, Any]]:
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
        sql += " WHERE t.name = :tenant"
        params["tenant"] = tenant_name
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql + " ORDER BY t.name, s.name"), params).mappings()]


def create_token(engine: Engine, *, tenant_name: str | None, name: str, scopes: list[str] | None = None,
                 subject: str | None = None, groups: list[str] | None = None,
                 expires_at: datetime | None = None, admin: bool = False) -> tuple[str, Token]:
    scopes = scopes or list(ALL_SCOPES)
    for scope in scopes:
        if scope not in ALL_SCOPES:
            raise InvalidArgument("scope", f"unknown scope '{scope}' (known: {', '.join(ALL_SCOPES)})")
    new = pat.generate(admin=admin)
    with Session(engine) as session, session.begin():
        tenant_id = None if admin else _tenant(session, tenant_name or "").id
        token = Token(lookup_id=new.lookup_id, tenant_id=tenant_id, kind="admin" if admin else "tenant",
                      name=name, subject=subject or f"user:{name}", groups=groups or [],
                      scopes=[] if admin else scopes, hash=new.hash, fingerprint=new.fingerprint,
                      expires_at=expires_at)
        session.add(token)
        session.flush()
        session.refresh(token)
        session.expunge(token)
    return new.token, token


def list_tokens(engine: Engine, tenant_name: str | None = None) -> list[dict[str, Any]]:
    sql = """SELECT k.id, k.lookup_id, coalesce(t.name, '(cluster admin)') AS tenant, k.name, k.subject,
                    k.groups, k.scopes, k.created_at, k.expires_at, k.revoked_at
               FROM tokens k LEFT JOIN tenants t ON t.id = k.tenant_id"""
    params: dict[str, Any] = {}
    if tenant_name:
        sql += " WHERE t.name = :tenant"
        params["tenant"] = tenant_name
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(text(sql + " ORDER BY k.created_at"), params).mappings()]


def revoke_token(engine: Engine, ident: str, *, force: bool = False) -> int:
    """Revoke by token id, lookup id, or the token itself."""
    lookup = pat.parse(ident).lookup_id if pat.looks_like_pat(ident) else ident
    try:
        as_uuid: uuid.UUID | None = uuid.UUID(ident)
    except ValueError:
        as_uuid = None
    with Session(engine) as session:
        for token in session.scalars(select(Token).where(
                Token.revoked_at.is_(None), (Token.lookup_id == lookup) | (Token.id == as_uuid))):
            _guard(token, force)
    with engine.begin() as conn:
        count = conn.execute(
            text("UPDATE tokens SET revoked_at = now() WHERE revoked_at IS NULL "
                 "AND (lookup_id = :lookup OR id = :id)"), {"lookup": lookup, "id": as_uuid}).rowcount
    if count == 0:
        raise NotFound(f"no active token matches '{ident}'")
    return count


def add_grant(engine: Engine, *, source_id: uuid.UUID, subject: str, file_key: str | None = None,
              force: bool = False) -> Grant:
    if not subject.startswith(("user:", "group:")) or subject.endswith(":"):
        raise InvalidArgument("subject", "use user:<name> or group:<name>")
    with Session(engine) as session, session.begin():
        source = session.get(Source, source_id)
        if source is None:
            raise NotFound(f"no source {source_id}")
        if file_key is None:  # the operator manages whole-source grants; per-file grants stay free
            _guard(source, force)
        grant = Grant(tenant_id=source.tenant_id, source_id=source_id, file_key=file_key, subject=subject)
        session.add(grant)
        try:
            session.flush()
        except IntegrityError:
            raise Conflict("that grant already exists") from None
        session.refresh(grant)
        session.expunge(grant)
        return grant


def set_source_acl(engine: Engine, source_id: uuid.UUID, *, restricted: bool, force: bool = False) -> None:
    with Session(engine) as session, session.begin():
        source = session.get(Source, source_id)
        if source is None:
            raise NotFound(f"no source {source_id}")
        _guard(source, force)
        source.acl_mode = "restricted" if restricted else "tenant"


def list_grants(engine: Engine, source_id: uuid.UUID | None = None) -> list[dict[str, Any]]:
    with Session(engine) as session:
        query = select(Grant).order_by(Grant.id)
        if source_id:
            query = query.where(Grant.source_id == source_id)
        return [{"id": g.id, "source_id": g.source_id, "file_key": g.file_key, "subject": g.subject}
                for g in session.scalars(query)]


def revoke_grant(engine: Engine, grant_id: int, *, force: bool = False) -> None:
    with Session(engine) as session, session.begin():
        grant = session.get(Grant, grant_id)
        if grant is None:
            raise NotFound(f"no grant {grant_id}")
        if grant.file_key is None:
            _guard(session.get(Source, grant.source_id), force)
        session.delete(grant)


def audit_rows(engine: Engine, *, tool: str | None = None, tenant_name: str | None = None,
               status: str | None = None, principal: str | None = None, since: datetime | None = None,
               until: datetime | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Newest first; every filter optional. `principal` matches 'user:NAME' or plain NAME."""
    with Session(engine) as session:
        query = select(AuditRow).order_by(AuditRow.id.desc()).limit(limit)
        if tool:
            query = query.where(AuditRow.tool == tool)
        if tenant_name:
            query = query.where(AuditRow.tenant_id == _tenant(session, tenant_name).id)
        if status:
            query = query.where(AuditRow.status == status)
        if principal:
            names = [principal] if ":" in principal else [principal, f"user:{principal}"]
            query = query.where(AuditRow.principal.in_(names))
        if since:
            query = query.where(AuditRow.ts >= since)
        if until:
            query = query.where(AuditRow.ts < until)
        return [{"ts": r.ts, "principal": r.principal, "tool": r.tool, "arguments": r.arguments,
                 "source_ids": [str(s) for s in r.source_ids], "row_count": r.row_count, "status": r.status,
                 "error": r.error, "client_ip": r.client_ip, "keys": r.keys, "duration_ms": r.duration_ms}
                for r in session.scalars(query)]
