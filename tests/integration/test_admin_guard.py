"""Rows the operator manages are refused to the CLI without --force; CLI rows stay editable."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from helpers import db_of
from kdbl_control import admin


def test_cli_refuses_operator_managed_rows_without_force(owner_engine, tmp_path, unique):
    tenant = admin.create_tenant(db_of(owner_engine), f"op-{unique}")
    source = admin.add_source(db_of(owner_engine), tenant.name, protocol="fs",
                              config={"root": str(tmp_path)}, name="s")
    token, row = admin.create_token(db_of(owner_engine), tenant_name=tenant.name, name="boot")
    with owner_engine.begin() as conn:
        for table, key in (("tenants", tenant.id), ("sources", source.id), ("tokens", row.id)):
            conn.execute(text(f"UPDATE {table} SET managed_by = 'operator' WHERE id = :i"), {"i": key})
    with pytest.raises(admin.Conflict, match="managed by the kdbl operator"):
        admin.add_source(db_of(owner_engine), tenant.name, protocol="fs", config={"root": str(tmp_path)},
                         name="t")
    with pytest.raises(admin.Conflict):
        admin.add_grant(db_of(owner_engine), source_id=source.id, subject="group:eng")
    with pytest.raises(admin.Conflict):
        admin.revoke_token(db_of(owner_engine), str(row.id))
    with pytest.raises(admin.Conflict):
        admin.set_source_acl(db_of(owner_engine), source.id, restricted=True)
    admin.add_grant(db_of(owner_engine), source_id=source.id, subject="user:a",
                    file_key="one.md")  # per-file: free
    assert admin.add_grant(db_of(owner_engine), source_id=source.id, subject="group:eng", force=True).id
    assert admin.revoke_token(db_of(owner_engine), str(row.id), force=True) == 1
