"""Typed ORM models of the tables `kdbl-control` writes through the ORM (tenants, sources, grants, tokens,
audit); migrations/sql is the source of truth for DDL and policies."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, BigInteger, Boolean, DateTime, ForeignKey, Integer, LargeBinary, Text
from sqlalchemy import text as sql_text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


def _uuid_pk() -> Mapped[uuid.UUID]:
    return mapped_column(UUID(as_uuid=True), primary_key=True, server_default=sql_text("gen_random_uuid()"))


def _now() -> Mapped[datetime]:
    return mapped_column(DateTime(timezone=True), server_default=sql_text("now()"))


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[uuid.UUID] = _uuid_pk()
    name: Mapped[str] = mapped_column(Text, unique=True)
    display_name: Mapped[str | None] = mapped_column(Text)
    hybrid_enabled: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    managed_by: Mapped[str] = mapped_column(Text, server_default=sql_text("'cli'"))
    settings: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sql_text("'{}'::jsonb"))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Source(Base):
    __tablename__ = "sources"
    id: Mapped[uuid.UUID] = _uuid_pk()
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(Text)
    protocol: Mapped[str] = mapped_column(Text)
    config: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sql_text("'{}'::jsonb"))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    hybrid_enabled: Mapped[bool] = mapped_column(Boolean, server_default=sql_text("true"))
    acl_mode: Mapped[str] = mapped_column(Text, server_default=sql_text("'tenant'"))
    schedule: Mapped[str | None] = mapped_column(Text)
    managed_by: Mapped[str] = mapped_column(Text, server_default=sql_text("'cli'"))
    last_indexed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


class Grant(Base):
    __tablename__ = "grants"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    source_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("sources.id", ondelete="CASCADE"))
    file_key: Mapped[str | None] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()


class Token(Base):
    __tablename__ = "tokens"
    id: Mapped[uuid.UUID] = _uuid_pk()
    lookup_id: Mapped[str] = mapped_column(Text, unique=True)
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(Text)
    subject: Mapped[str] = mapped_column(Text)
    groups: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    scopes: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    hash: Mapped[str] = mapped_column(Text)
    fingerprint: Mapped[bytes | None] = mapped_column(LargeBinary)  # pat.fingerprint (migration 0009)
    managed_by: Mapped[str] = mapped_column(Text, server_default=sql_text("'cli'"))
    created_at: Mapped[datetime] = _now()
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class AuditRow(Base):
    __tablename__ = "audit"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    ts: Mapped[datetime] = _now()
    tenant_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    principal: Mapped[str] = mapped_column(Text)
    token_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))
    tool: Mapped[str] = mapped_column(Text)
    arguments: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=sql_text("'{}'::jsonb"))
    source_ids: Mapped[list[uuid.UUID]] = mapped_column(ARRAY(UUID(as_uuid=True)), server_default=sql_text("'{}'"))
    keys: Mapped[list[str]] = mapped_column(ARRAY(Text), server_default=sql_text("'{}'"))
    row_count: Mapped[int] = mapped_column(Integer, server_default=sql_text("0"))
    status: Mapped[str] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    client_ip: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float | None] = mapped_column()
