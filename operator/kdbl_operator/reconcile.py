"""Converging the database: one transaction per reconcile, decisions from `desired`, SQL from
`kdbl_operator.db_sync`. Synchronous (a psycopg pool); the handlers run these in worker threads.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kdbl_core.sources import relabel
from kdbl_operator import desired
from kdbl_operator import db_sync as db
from kdbl_operator.db_sync import Pool
from kdbl_operator.desired import InvalidSpec


@dataclass
class Converged:
    row_id: uuid.UUID
    action: str  # create | update | adopt
    changed: list[str] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    tenant_id: uuid.UUID | None = None


def _owner_of(row: Mapping[str, Any] | None, column: str, key: str) -> dict[str, Any] | None:
    if row is None:
        return None
    section = (row.get(column) or {}).get(key) or {}
    return section.get("owner")


def converge_tenant(pool: Pool, want: desired.DesiredTenant) -> Converged:
    mine = want.settings["operator"]["owner"]
    with db.transaction(pool) as conn:
        row = db.tenant_by_name(conn, want.name, lock=True)
        action = desired.claim(row, _owner_of(row, "settings", "operator"), mine, adopt=want.adopt,
                               what=f"tenant '{want.name}'")
        if row is None:
            tenant_id = db.insert_tenant(conn, want.name, want.row)
            changed: list[str] = []
        else:
            tenant_id = row["id"]
            diff = desired.changes(row, want.row)
            db.update_tenant(conn, tenant_id, diff)
            changed = sorted(diff)
        if db.sync_inherited_hybrid(conn, tenant_id, want.hybrid):
            changed.append("sources.hybrid_enabled")
        counts = db.tenant_counts(conn, tenant_id)
    return Converged(tenant_id, action, changed, counts, tenant_id)


def converge_source(pool: Pool, want: desired.DesiredSource) -> Converged:
    mine = want.config["k8s"]["owner"]
    with db.transaction(pool) as conn:
        tenant = db.tenant_by_name(conn, want.tenant)
        if tenant is None:
            raise InvalidSpec(desired.TENANT_NOT_FOUND, f"no tenant '{want.tenant}' (create its Tenant resource)")
        if tenant["managed_by"] != desired.MANAGED_BY:
            raise InvalidSpec(desired.TENANT_NOT_MANAGED,
                              f"tenant '{want.tenant}' is managed by kdbl-control, not by a Tenant resource")
        if not desired.namespace_allowed(tenant["settings"] or {}, want.namespace):
            raise InvalidSpec(desired.NAMESPACE_NOT_ALLOWED,
                              f"tenant '{want.tenant}' does not accept Sources from namespace '{want.namespace}' "
                              "(add it to the Tenant's spec.sourceNamespaces)")
        owned = db.source_by_owner(conn, mine["kind"], mine.get("namespace", ""), mine["name"])
        if owned is not None and owned["tenant_id"] != tenant["id"]:
            raise InvalidSpec(desired.INVALID_SPEC, "spec.tenantRef changed after the source was registered; "
                                                    "tenantRef is immutable: delete this Source and create a new one")
        row = db.source_by_name(conn, tenant["id"], want.name, lock=True)
        if row is None and owned is not None:  # spec.name changed: rename in place, keep the index
            db.rename_source(conn, owned["id"], want.name)
            row = db.source_by_name(conn, tenant["id"], want.name, lock=True)
        action = desired.claim(row, _owner_of(row, "config", "k8s"), mine, adopt=want.adopt,
                               what=f"source '{want.name}' of tenant '{want.tenant}'")
        values = want.row(tenant["hybrid_enabled"])
        if row is None:
            source_id = db.insert_source(conn, tenant["id"], want.name, values)
            changed: list[str] = []
        else:
            source_id = row["id"]
            diff = desired.changes(row, values)
            db.update_source(conn, source_id, diff)
            changed = sorted(diff)
            # spec.labels / spec.labelGlobs changed: every file's labels follow in this transaction
            if "config" in diff and relabel.apply_config_change(conn, source_id, row["config"], values["config"]):
                changed.append("files.labels")
        add, remove = desired.grant_changes(db.source_grants(conn, source_id), want.grants)
        db.change_grants(conn, tenant["id"], source_id, add=add, remove=remove)
        if add or remove:
            changed.append("grants")
        counts = db.source_counts(conn, source_id)
    return Converged(source_id, action, changed, counts, tenant["id"])


# ------------------------------------------------------------------------------------------------
# bootstrap tokens
# ------------------------------------------------------------------------------------------------
def active_bootstrap_tokens(pool: Pool, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    with db.transaction(pool) as conn:
        return db.bootstrap_tokens(conn, tenant_id)


def record_bootstrap(pool: Pool, tenant_id: uuid.UUID, boot: desired.BootstrapToken, *,
                     new: tuple[str, str, bytes] | None, keep: str | None, revoke: tuple[str, ...]) -> bool:
    """new: (lookup_id, hash, fingerprint) of a freshly written token; keep: the lookup id that stays. Returns whether
    a row changed."""
    changed = False
    with db.transaction(pool) as conn:
        if new is not None:
            db.insert_bootstrap_token(conn, tenant_id, lookup_id=new[0], token_hash=new[1], fingerprint=new[2],
                                      subject=boot.subject, groups=list(boot.groups), scopes=list(boot.scopes))
            changed = True
        elif keep is not None:
            for token in db.bootstrap_tokens(conn, tenant_id):
                if token["lookup_id"] == keep:
                    changed |= db.update_token_grants(conn, token["id"], subject=boot.subject,
                                                      groups=list(boot.groups), scopes=list(boot.scopes))
        changed |= db.revoke_bootstrap_tokens(conn, tenant_id, revoke) > 0
    return changed


def revoke_all_bootstrap(pool: Pool, tenant_id: uuid.UUID) -> int:
    with db.transaction(pool) as conn:
        return db.revoke_bootstrap_tokens(conn, tenant_id, [t["lookup_id"] for t in db.bootstrap_tokens(conn, tenant_id)])


# ------------------------------------------------------------------------------------------------
# deletion (finalizers): bounded batches, resumable
# ------------------------------------------------------------------------------------------------
def delete_source(pool: Pool, owner: Mapping[str, Any], *, batch: int, max_batches: int) -> int:
    """Remove the source row written for this Source resource; returns the files still left (0 = done)."""
    with db.transaction(pool) as conn:
        row = db.source_by_owner(conn, owner["kind"], owner.get("namespace", ""), owner["name"])
    if row is None:
        return 0  # never registered, already gone, or someone else's row: nothing of ours to delete
    for _ in range(max_batches):
        with db.transaction(pool) as conn:
            if db.delete_source_files(conn, row["tenant_id"], row["id"], batch) == 0:
                db.delete_source(conn, row["id"])
                return 0
    with db.transaction(pool) as conn:
        return db.remaining_files(conn, source_id=row["id"]) or 1


def delete_tenant(pool: Pool, name: str, owner: Mapping[str, Any], *, batch: int, max_batches: int) -> int:
    """Remove everything of the tenant this Tenant resource owns; returns rows still left (0 = done)."""
    with db.transaction(pool) as conn:
        row = db.tenant_by_name(conn, name)
    if row is None or row["managed_by"] != desired.MANAGED_BY:
        return 0  # never ours (e.g. a NameConflict with a kdbl-control tenant): leave it alone
    marker = _owner_of(row, "settings", "operator")
    if marker is not None and not desired.same_owner(marker, owner):
        return 0
    for _ in range(max_batches):
        with db.transaction(pool) as conn:
            if db.delete_tenant_batch(conn, row["id"], batch) == 0:
                db.delete_tenant(conn, row["id"])
                return 0
    with db.transaction(pool) as conn:
        return db.remaining_files(conn, tenant_id=row["id"]) or 1
