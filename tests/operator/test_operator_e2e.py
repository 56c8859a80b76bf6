"""End to end: the real kopf operator against the emulated API server and the real PostgreSQL."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from helpers import POSTINGS, db_of
from kdbl_core.access import tokens
from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import store
from kdbl_core.content.records import Chunk, FileMeta
from operator_helpers import secret, source, tenant
from sqlalchemy import text


def _tenant_row(engine: Any, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM tenants WHERE name = :n"), {"n": name}).mappings().first()
        return dict(row) if row else None


def _source_row(engine: Any, tenant_name: str, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT s.* FROM sources s JOIN tenants t ON t.id = s.tenant_id "
                                "WHERE t.name = :t AND s.name = :n"), {"t": tenant_name, "n": name}).mappings().first()
        return dict(row) if row else None


def _tokens(engine: Any, tenant_name: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT k.* FROM tokens k JOIN tenants t ON t.id = k.tenant_id WHERE t.name = :t "
                                 "ORDER BY k.created_at"), {"t": tenant_name}).mappings()
        return [dict(r) for r in rows]


def _grants(engine: Any, source_id: uuid.UUID) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT subject FROM grants WHERE source_id = :s AND file_key IS NULL"),
                                {"s": source_id}).scalars())


async def test_a_tenant_resource_creates_updates_and_deletes_its_tenant_row_and_bootstrap_token(
        operator, owner_engine, names):
    name = names("acme")
    await operator.create(tenant(name, hybrid=True, bootstrapToken={"scopes": ["kdbl.search"], "groups": ["staff"]},
                                 mcp={"tools": ["search_content"]}, rateLimit={"requestsPerMinute": 120}))
    status = await operator.ready("Tenant", name)
    row = _tenant_row(owner_engine, name)
    assert row["managed_by"] == "operator" and row["hybrid_enabled"] is True
    assert row["display_name"] == f"Tenant {name}"
    assert row["settings"]["mcp"]["tools"] == ["search_content"]
    assert row["settings"]["rate_limit"] == {"per_minute": 120}
    assert status["tenantId"] == str(row["id"]) and status["phase"] == "Ready"
    assert status["observedGeneration"] == 1

    # The bootstrap PAT: in a Secret of the tenant's (default: the operator's) namespace, only its hash in the DB.
    assert status["bootstrapSecretRef"] == {"name": f"kdbl-tenant-{name}-bootstrap", "namespace": "kdbl"}
    token = operator.secret_token("kdbl", f"kdbl-tenant-{name}-bootstrap")
    [row_token] = _tokens(owner_engine, name)
    assert row_token["managed_by"] == "operator" and row_token["scopes"] == ["kdbl.search"]
    assert row_token["groups"] == ["staff"] and row_token["lookup_id"] == tokens.parse(token).lookup_id
    assert tokens.verify_secret(row_token["hash"], token) and token not in json.dumps(row_token, default=str)
    await operator.eventually(lambda: operator.events(name, "BootstrapTokenIssued"), what="event")

    # Update: the row follows the spec; the token is not re-issued.
    await operator.patch("Tenant", name, {"spec": {"hybrid": False, "displayName": "ACME Corp",
                                                   "mcp": {"modes": ["lexical"]}}})
    await operator.eventually(lambda: _tenant_row(owner_engine, name)["hybrid_enabled"] is False, what="hybrid off")
    assert _tenant_row(owner_engine, name)["display_name"] == "ACME Corp"
    await operator.eventually(lambda: operator.status("Tenant", name).get("observedGeneration") == 2)
    assert len(_tokens(owner_engine, name)) == 1

    # Rotation on request: a new token in the same Secret, the old one revoked at once.
    await operator.patch("Tenant", name, {"metadata": {"annotations": {"kdbl.io/rotate-bootstrap-token": "2025-01"}}})
    new_token = await operator.eventually(
        lambda: (t := operator.secret_token("kdbl", f"kdbl-tenant-{name}-bootstrap")) != token and t, what="rotation")
    old, new = await operator.eventually(lambda: len(t := _tokens(owner_engine, name)) == 2 and t[0]["revoked_at"]
                                         and t, what="old token revoked")
    assert old["revoked_at"] is not None and new["revoked_at"] is None
    assert tokens.verify_secret(new["hash"], new_token) and not tokens.verify_secret(new["hash"], token)
    await operator.eventually(lambda: operator.status("Tenant", name)["bootstrapToken"]["rotation"] == "2025-01")
    await operator.eventually(lambda: operator.events(name, "BootstrapTokenRotated"), what="event")

    # Delete: the finalizer removes the tenant (and with it the tokens) before the object goes.
    await operator.delete("Tenant", name)
    await operator.eventually(lambda: operator.get("Tenant", name) is None, what="Tenant gone")
    assert _tenant_row(owner_engine, name) is None and _tokens(owner_engine, name) == []


def _write_files(owner_engine: Any, tenant_id: uuid.UUID, source_id: uuid.UUID, n: int) -> None:
    """Index n small files as the worker would (chunks, postings, BM25 statistics)."""
    for i in range(n):
        with tenant_transaction(db_of(owner_engine), tenant_id) as conn:
            body = f"quarterly report number {i} about revenue and costs"
            store.write_file(conn, tenant_id=tenant_id, source_id=source_id, meta=FileMeta(key=f"doc{i}.txt"),
                               status="ok", status_reason=None, title=None, text_chars=len(body), ts_config="english",
                               chunks=[Chunk(seq=0, text=body, char_start=0, char_end=len(body))])


def _count(engine: Any, sql: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(sql), params).scalar_one())


async def test_a_source_resource_registers_its_source_with_a_secret_reference_grants_and_hybrid_toggle(
        operator, owner_engine, names):
    t = names("fin")
    await operator.create(tenant(t, hybrid=True, sourceNamespaces=["team-a"]))
    await operator.ready("Tenant", t)
    await operator.create(secret("s3-creds", "team-a", {"access_key_id": "AKIDEXAMPLE",
                                                        "secret_access_key": "very-secret-value"}))
    await operator.create(source("reports", t, "team-a", protocol="s3",
                                 connection={"endpoint": "https://minio.team-a:9000", "bucket": "reports",
                                             "prefix": "2024/"},
                                 credentialsSecretRef={"name": "s3-creds"}, include=["**/*.pdf"], exclude=["tmp/**"],
                                 schedule="*/30 * * * *", acl={"mode": "restricted", "groups": ["finance"],
                                                               "principals": ["alice"]}))
    status = await operator.ready("Source", "reports", "team-a")
    row = _source_row(owner_engine, t, "reports")
    assert row["managed_by"] == "operator" and row["protocol"] == "s3" and row["acl_mode"] == "restricted"
    assert row["schedule"] == "*/30 * * * *" and row["hybrid_enabled"] is True  # inherited from the tenant
    config = row["config"]
    assert config["bucket"] == "reports" and config["endpoint_url"] == "https://minio.team-a:9000"
    assert config["include"] == ["**/*.pdf"] and config["exclude"] == ["tmp/**"]
    assert config["credentials"] == {"dir": "/var/run/secrets/kdbl/sources/team-a/s3-creds"}
    assert config["credentials_secret"] == {"namespace": "team-a", "name": "s3-creds"}
    dumped = json.dumps(row, default=str)
    assert "very-secret-value" not in dumped and "AKIDEXAMPLE" not in dumped  # only the reference
    assert _grants(owner_engine, row["id"]) == {"group:finance", "user:alice"}
    assert status["sourceId"] == str(row["id"]) and status["files"] == 0 and status["embeddingProgress"] == 100

    # Spec changes: grants and the hybrid override converge; the tenant's toggle no longer applies.
    await operator.patch("Source", "reports", {"spec": {"hybrid": False, "acl": {"groups": ["finance", "audit"],
                                                                                 "principals": None}}}, "team-a")
    await operator.eventually(lambda: _grants(owner_engine, row["id"]) == {"group:finance", "group:audit"},
                              what="grants")
    assert _source_row(owner_engine, t, "reports")["hybrid_enabled"] is False

    # Indexed content shows up in the status on the next resync.
    _write_files(owner_engine, row["tenant_id"], row["id"], 3)
    await operator.eventually(lambda: operator.status("Source", "reports", "team-a").get("files") == 3, what="counts")
    assert operator.status("Source", "reports", "team-a")["chunks"] == 3
    assert operator.status("Source", "reports", "team-a")["embeddingProgress"] == 0


async def test_a_periodic_resync_corrects_drift_made_behind_the_operators_back(operator, owner_engine, names):
    t = names("drift")
    await operator.create(tenant(t, hybrid=True))
    await operator.create(source("docs", t, hybrid=True, acl={"mode": "tenant"}))
    await operator.ready("Source", "docs", "kdbl")
    await operator.handled("Tenant", t)
    await operator.handled("Source", "docs", "kdbl")
    row = _source_row(owner_engine, t, "docs")
    with owner_engine.begin() as conn:  # someone toggles the source and the tenant by SQL
        conn.execute(text("UPDATE sources SET hybrid_enabled = false, acl_mode = 'restricted' WHERE id = :s"),
                     {"s": row["id"]})
        conn.execute(text("UPDATE tenants SET hybrid_enabled = false, display_name = 'x' WHERE id = :t"),
                     {"t": row["tenant_id"]})
    await operator.eventually(lambda: _source_row(owner_engine, t, "docs")["hybrid_enabled"] is True
                              and _source_row(owner_engine, t, "docs")["acl_mode"] == "tenant", what="source drift")
    await operator.eventually(lambda: _tenant_row(owner_engine, t)["hybrid_enabled"] is True, what="tenant drift")
    assert _tenant_row(owner_engine, t)["display_name"] == f"Tenant {t}"
    events = await operator.eventually(lambda: operator.events("docs", "DriftCorrected"), what="drift event")
    assert "acl_mode" in events[0]["message"] and "hybrid_enabled" in events[0]["message"]
    await operator.eventually(lambda: operator.events(t, "DriftCorrected"), what="tenant drift event")


async def test_deleting_a_source_removes_its_files_and_chunks_in_resumable_batches(operator, owner_engine, names):
    t = names("del")
    await operator.create(tenant(t))
    await operator.create(source("bulk", t))
    await operator.create(source("keep", t))
    await operator.ready("Source", "bulk", "kdbl")
    await operator.ready("Source", "keep", "kdbl")
    bulk, keep = _source_row(owner_engine, t, "bulk"), _source_row(owner_engine, t, "keep")
    _write_files(owner_engine, bulk["tenant_id"], bulk["id"], 5)
    _write_files(owner_engine, keep["tenant_id"], keep["id"], 1)

    await operator.delete("Source", "bulk", "kdbl")
    await operator.eventually(lambda: operator.get("Source", "bulk", "kdbl") is None, what="Source gone")
    assert _source_row(owner_engine, t, "bulk") is None
    assert _count(owner_engine, "SELECT count(*) FROM files WHERE source_id = :s", s=bulk["id"]) == 0
    assert _count(owner_engine, "SELECT count(*) FROM chunks WHERE source_id = :s", s=bulk["id"]) == 0
    assert _count(owner_engine, f"SELECT count(*) FROM {POSTINGS} WHERE source_id = :s", s=bulk["id"]) == 0
    # Batches of 2 files, one batch per pass: the finalizer reported progress between passes.
    left = [h.get("status", {}).get("message") for h in operator.history("Source", "bulk", "kdbl")]
    assert "deleting source data: 3 files left" in left and "deleting source data: 1 files left" in left
    # The other source and the BM25 statistics stay exact.
    assert _count(owner_engine, "SELECT count(*) FROM files WHERE source_id = :s", s=keep["id"]) == 1
    assert _count(owner_engine, "SELECT coalesce(sum(n_chunks), 0) FROM corpus_stats WHERE tenant_id = :t",
                  t=keep["tenant_id"]) == 1
    assert _count(owner_engine, "SELECT coalesce(sum(df), 0) FROM term_stats WHERE tenant_id = :t AND term = 'revenu'",
                  t=keep["tenant_id"]) == 1


async def test_deleting_a_tenant_removes_everything_of_it(operator, owner_engine, names):
    t = names("gone")
    await operator.create(tenant(t))
    await operator.create(source("a", t, acl={"mode": "restricted", "groups": ["x"]}))
    await operator.ready("Source", "a", "kdbl")
    row = _source_row(owner_engine, t, "a")
    _write_files(owner_engine, row["tenant_id"], row["id"], 3)
    with owner_engine.begin() as conn:
        conn.execute(text("INSERT INTO audit (tenant_id, principal, tool, status) VALUES (:t, 'user:a', 'x', 'ok')"),
                     {"t": row["tenant_id"]})
    await operator.delete("Tenant", t)
    await operator.eventually(lambda: operator.get("Tenant", t) is None, timeout=30, what="Tenant gone")
    for table in ("files", "chunks", "postings", "term_stats", "corpus_stats", "grants", "tokens", "sources", "audit"):
        assert _count(owner_engine, f"SELECT count(*) FROM {table} WHERE tenant_id = :t", t=row["tenant_id"]) == 0, table
    assert _tenant_row(owner_engine, t) is None
    # Its Source now points at nothing: Degraded, never crashing; deleting it completes at once.
    await operator.degraded("Source", "a", "TenantNotFound", "kdbl")
    await operator.delete("Source", "a", "kdbl")
    await operator.eventually(lambda: operator.get("Source", "a", "kdbl") is None, what="orphan Source gone")


async def test_each_invalid_spec_class_sets_a_precise_degraded_reason_and_never_stops_the_operator(
        operator, owner_engine, names):
    ok, missing = names("ok"), names("later")
    await operator.create(tenant(ok, sourceNamespaces=["team-a"]))
    await operator.ready("Tenant", ok)

    # Unknown tenant: retried with backoff, and converges once the Tenant appears.
    await operator.create(source("orphan", missing))
    cond = await operator.degraded("Source", "orphan", "TenantNotFound", "kdbl")
    assert missing in cond["message"]
    assert operator.condition("Source", "orphan", "Reconciling", "kdbl")["status"] == "True"
    assert operator.condition("Source", "orphan", "Ready", "kdbl")["status"] == "False"

    # Missing Secret, then a Secret without the keys the protocol needs.
    await operator.create(source("creds", ok, protocol="webdav", connection={"url": "https://dav.example/share/"},
                                 credentialsSecretRef={"name": "dav-creds"}))
    cond = await operator.degraded("Source", "creds", "SecretNotFound", "kdbl")
    assert "kdbl/dav-creds" in cond["message"]
    await operator.create(secret("dav-creds", "kdbl", {"username": "svc"}))
    cond = await operator.degraded("Source", "creds", "SecretKeysMissing", "kdbl")
    assert "password" in cond["message"] and "svc" not in cond["message"]

    # Bad schedule: permanent (no retry loop) until the spec changes.
    await operator.create(source("sched", ok, schedule="every five minutes"))
    cond = await operator.degraded("Source", "sched", "InvalidSchedule", "kdbl")
    assert "5 fields" in cond["message"] or "cron" in cond["message"]
    assert operator.condition("Source", "sched", "Reconciling", "kdbl")["status"] == "False"
    assert _source_row(owner_engine, ok, "sched") is None

    # Conflicting names: a second Source for the same tenant and name, from another namespace.
    await operator.create(source("first", ok, name="shared"))
    await operator.ready("Source", "first", "kdbl")
    await operator.create(source("second", ok, "team-a", name="shared"))
    cond = await operator.degraded("Source", "second", "NameConflict", "team-a")
    assert "kdbl/first" in cond["message"]

    # A namespace the tenant does not accept Sources from.
    await operator.create(source("elsewhere", ok, "team-b"))
    await operator.degraded("Source", "elsewhere", "NamespaceNotAllowed", "team-b")

    # Tenants: a name the database refuses, a home namespace that does not exist, a contradictory spec.
    await operator.create(tenant("dotted.name"))
    await operator.degraded("Tenant", "dotted.name", "InvalidName")
    nons = names("nons")
    await operator.create(tenant(nons, namespace="no-such-namespace"))
    cond = await operator.degraded("Tenant", nons, "NamespaceNotFound")
    assert "no-such-namespace" in cond["message"]
    contra = names("contra")
    await operator.create(tenant(contra, hybrid=True, mcp={"modes": ["lexical"]}))
    await operator.degraded("Tenant", contra, "InvalidSpec")

    # Each Degraded transition was announced by a Warning Event naming the reason.
    for obj, reason in (("orphan", "TenantNotFound"), ("creds", "SecretKeysMissing"), ("sched", "InvalidSchedule"),
                        ("second", "NameConflict"), ("dotted.name", "InvalidName")):
        events = await operator.eventually(lambda o=obj, r=reason: operator.events(o, r), what=f"{reason} event")
        assert events[0]["type"] == "Warning"

    # Fixing what was wrong converges, without restarting anything.
    await operator.create(tenant(missing))
    await operator.ready("Source", "orphan", "kdbl")
    await operator.patch("Secret", "dav-creds", {"data": {"password": "cGFzcw=="}}, "kdbl")
    await operator.ready("Source", "creds", "kdbl")
    await operator.patch("Source", "sched", {"spec": {"schedule": "@every 5m"}}, "kdbl")
    await operator.ready("Source", "sched", "kdbl")
    assert _source_row(owner_engine, ok, "sched")["schedule"] == "@every 5m"
    await operator.eventually(lambda: operator.events("orphan", "Reconciled"), what="recovery event")


async def test_rows_of_kdbl_control_are_never_taken_over_or_deleted_without_the_adopt_annotation(
        operator, owner_engine, names):
    from kdbl_control import admin

    name = names("cli")
    admin.create_tenant(db_of(owner_engine), name, display_name="Made by the CLI")
    await operator.create(tenant(name))
    cond = await operator.degraded("Tenant", name, "NameConflict")
    assert "kdbl-control" in cond["message"] and "kdbl.io/adopt" in cond["message"]
    assert _tenant_row(owner_engine, name)["managed_by"] == "cli"

    await operator.delete("Tenant", name)  # its finalizer must not delete the CLI's tenant
    await operator.eventually(lambda: operator.get("Tenant", name) is None, what="Tenant gone")
    assert _tenant_row(owner_engine, name)["display_name"] == "Made by the CLI"

    adopted = tenant(name)
    adopted["metadata"]["annotations"] = {"kdbl.io/adopt": "true"}
    await operator.create(adopted)
    await operator.ready("Tenant", name)
    row = _tenant_row(owner_engine, name)
    assert row["managed_by"] == "operator" and row["display_name"] == f"Tenant {name}"
    await operator.eventually(lambda: operator.events(name, "Adopted"), what="Adopted event")

    # The CLI now refuses to edit the operator's rows without --force.
    await operator.create(source("src", name))
    await operator.ready("Source", "src", "kdbl")
    source_id = _source_row(owner_engine, name, "src")["id"]
    with pytest.raises(admin.Conflict, match="managed by the kdbl operator"):
        admin.set_source_acl(db_of(owner_engine), source_id, restricted=True)
