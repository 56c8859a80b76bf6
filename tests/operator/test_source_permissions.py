"""A Source's readers from the share (issue 30): spec.permissions (tenant | grants | from-source),
spec.permissionMap and the deprecated spec.acl.honorFilePermissions, first as the pure spec -> row
translation (kdbl_operator.desired), then end to end: the real kopf operator (kmock API emulator) writes
sources.acl_mode and sources.permission_map, the real worker crawls a folder from-source, and switching the
resource back to tenant gives the share's permissions back (the files' permission sets are cleared)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import Corpus, crawl
from kdbl_core.access import share_acl
from kdbl_core.sources.config import PERMISSION_CHECKS
from kdbl_operator import desired
from kdbl_operator.desired import InvalidSpec
from operator_helpers import source, tenant
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[2]
SID = "S-1-5-21-3623811015-3361044348-30300820"
MAP = {"uid:1000": "user:alice", "gid:100": "group:staff", f"{SID}-1104": "user:bob",
       f"{SID}-1201": "sid:S-1-5-32-545"}
CONNECTIONS = {"fs": {"path": "/data/docs"}, "smb": {"server": "fs01", "share": "Docs"},
               "s3": {"bucket": "docs"}, "webdav": {"url": "https://dav.example/docs/"},
               "http": {"url": "https://www.example/docs/"}}


def body(protocol: str = "fs", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Source", "metadata": {"name": "docs", "namespace": "team-a"},
            "spec": {"tenantRef": {"name": "acme"}, "protocol": protocol, "connection": CONNECTIONS[protocol], **spec}}


def refused(**kwargs: Any) -> str:
    with pytest.raises(InvalidSpec) as exc:
        desired.source(body(**kwargs))
    assert exc.value.reason == desired.INVALID_SPEC and not exc.value.temporary
    return exc.value.message


# ------------------------------------------------------------------------------------------------
# spec -> row
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", share_acl.FROM_SOURCE_PROTOCOLS)
def test_permissions_from_source_on_fs_and_smb_store_acl_mode_source_and_the_map(protocol):
    want = desired.source(body(protocol, permissions="from-source", permissionMap=MAP))
    assert want.acl_mode == "source" and want.permission_map == MAP
    row = want.row(tenant_hybrid=True)
    assert row["acl_mode"] == "source" and row["permission_map"] == MAP
    assert "honor_file_permissions" not in want.config and "permission_map" not in want.config


@pytest.mark.parametrize("permissions,acl_mode", [("tenant", "tenant"), ("grants", "restricted"),
                                                   ("from-source", "source")])
def test_each_permissions_name_is_the_clis_acl_mode(permissions, acl_mode):
    assert share_acl.PERMISSION_MODES[permissions] == acl_mode
    assert desired.source(body(permissions=permissions)).acl_mode == acl_mode


def test_without_spec_permissions_the_older_fields_decide_as_before():
    assert desired.source(body()).acl_mode == "tenant"
    assert desired.source(body(acl={"mode": "tenant"})).acl_mode == "tenant"
    assert desired.source(body(acl={"mode": "restricted", "groups": ["hr"]})).acl_mode == "restricted"
    assert desired.source(body()).permission_map == {} and desired.source(body()).row(True)["permission_map"] == {}


@pytest.mark.parametrize("protocol", share_acl.FROM_SOURCE_PROTOCOLS)
def test_honor_file_permissions_is_a_deprecated_alias_of_from_source(protocol):
    # the CRD defaults acl.mode to tenant beside it: the default yields
    for acl in ({"honorFilePermissions": True}, {"honorFilePermissions": True, "mode": "tenant"}):
        want = desired.source(body(protocol, acl=acl))
        assert want.acl_mode == "source" and "honor_file_permissions" not in want.config
    assert desired.source(body(protocol, permissions="from-source", acl={"honorFilePermissions": True})).acl_mode \
        == "source"
    assert desired.source(body(protocol, acl={"honorFilePermissions": False})).acl_mode == "tenant"


@pytest.mark.parametrize("protocol", ["s3", "webdav", "http"])
def test_from_source_is_refused_where_the_protocol_carries_no_per_file_readers(protocol):
    message = refused(protocol=protocol, permissions="from-source")
    assert message.startswith("spec.permissions: ") and protocol in message and "spec.permissions grants" in message
    alias = refused(protocol=protocol, acl={"honorFilePermissions": True})
    assert alias.startswith("spec.acl.honorFilePermissions: ") and "from-source" in alias
    # grants and tenant stay valid there
    assert desired.source(body(protocol, permissions="grants", acl={"groups": ["hr"]})).acl_mode == "restricted"


def test_a_permission_map_may_open_an_id_to_everyone_in_the_tenant():
    want = desired.source(body("smb", permissions="from-source", permissionMap={f"{SID}-513": share_acl.EVERYONE}))
    assert want.permission_map == {f"{SID}-513": "*"}


@pytest.mark.parametrize("names,says", [
    ({"uid:1000": "alice"}, "'uid:1000'"),
    ({"alice": "user:alice"}, "'alice'"),
    ({"uid:1000": 1000}, "'uid:1000'"),
    ({"S-1-5": "user:bob"}, "'S-1-5'"),
    (["uid:1000"], "object"),
])
def test_a_bad_permission_map_is_refused_naming_spec_permission_map(names, says):
    message = refused(permissions="from-source", permissionMap=names)
    assert message.startswith("spec.permissionMap") and says in message


@pytest.mark.parametrize("spec,fields", [
    ({"permissions": "tenant", "acl": {"mode": "restricted"}}, ("spec.permissions", "spec.acl.mode")),
    ({"permissions": "from-source", "acl": {"mode": "restricted"}}, ("spec.permissions", "spec.acl.mode")),
    ({"permissions": "grants", "acl": {"honorFilePermissions": True}},
     ("spec.permissions", "spec.acl.honorFilePermissions")),
    ({"permissions": "tenant", "acl": {"honorFilePermissions": True}},
     ("spec.permissions", "spec.acl.honorFilePermissions")),
    ({"acl": {"mode": "restricted", "honorFilePermissions": True}},
     ("spec.acl.honorFilePermissions", "spec.acl.mode")),
])
def test_contradicting_fields_are_refused_naming_both(spec, fields):
    message = refused(**spec)
    assert all(f in message for f in fields), message


def test_agreeing_fields_and_unknown_names():
    assert desired.source(body(permissions="grants", acl={"mode": "restricted"})).acl_mode == "restricted"
    assert desired.source(body(permissions="grants", acl={"mode": "tenant"})).acl_mode == "restricted"
    assert desired.source(body(permissions="from-source", acl={"mode": "tenant"})).acl_mode == "source"
    assert refused(permissions="restricted").startswith("spec.permissions 'restricted'")
    assert refused(acl={"honorFilePermissions": "yes"}).startswith("spec.acl.honorFilePermissions")


@pytest.mark.parametrize("permissions", list(share_acl.PERMISSION_MODES))
def test_whole_source_grants_stay_valid_in_every_mode(permissions):
    want = desired.source(body(permissions=permissions, acl={"principals": ["ann"], "groups": ["auditors"]}))
    assert want.grants == {"user:ann", "group:auditors"}


def test_the_crd_offers_the_same_names_and_a_map_of_strings():
    for path in (REPO / "operator" / "crds" / "sources.yaml",
                 REPO / "charts" / "kdbl" / "files" / "crds" / "sources.yaml"):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert spec["properties"]["permissions"]["enum"] == list(share_acl.PERMISSION_MODES)
        assert "default" not in spec["properties"]["permissions"]  # unset: the older acl fields decide
        assert spec["properties"]["permissionMap"]["additionalProperties"]["type"] == "string"
        assert "Deprecated" in spec["properties"]["acl"]["properties"]["honorFilePermissions"]["description"]
        assert spec["properties"]["permissionChecks"]["enum"] == list(PERMISSION_CHECKS)


def test_smb_permission_checks_reach_the_config_and_other_protocols_are_refused():
    want = desired.source(body("smb", permissions="from-source", permissionChecks="changed",
                               permissionFullCheckHours=6))
    assert want.config["permission_checks"] == "changed" and want.config["permission_full_check_hours"] == 6
    assert "permission_checks" not in desired.source(body("smb", permissions="from-source")).config
    assert "spec.permissionChecks" in refused(permissions="from-source", permissionChecks="changed")  # fs
    assert "spec.permissionChecks" in refused(protocol="smb", permissionChecks="sometimes")


# ------------------------------------------------------------------------------------------------
# end to end: operator -> database -> worker
# ------------------------------------------------------------------------------------------------
def _row(engine: Any, tenant_name: str, name: str) -> dict[str, Any] | None:
    with engine.connect() as conn:
        row = conn.execute(text("SELECT s.id, s.tenant_id, s.acl_mode, s.permission_map, s.config FROM sources s "
                                "JOIN tenants t ON t.id = s.tenant_id WHERE t.name = :t AND s.name = :n"),
                           {"t": tenant_name, "n": name}).mappings().first()
        return dict(row) if row else None


def _sets(engine: Any, source_id: Any) -> dict[str, Any]:
    """Each file's permission set's rules (None: no set)."""
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT f.key, p.rules FROM files f "
                                 "LEFT JOIN permission_sets p ON p.id = f.permission_set WHERE f.source_id = :s"),
                            {"s": source_id})
        return {r.key: r.rules for r in rows}


def _grants(engine: Any, source_id: Any) -> set[str]:
    with engine.connect() as conn:
        return {r.subject for r in conn.execute(text("SELECT subject FROM grants WHERE source_id = :s "
                                                     "AND file_key IS NULL"), {"s": source_id})}


async def test_a_source_takes_its_readers_from_the_share_and_switching_back_clears_them(
        operator, owner_engine, worker_engine, names, tmp_path):
    t = names("perm")
    root = tmp_path / "share"
    (root / "team").mkdir(parents=True)
    (root / "team" / "plan.md").write_text("# Plan\nShip it.\n")
    (root / "readme.txt").write_text("Read me first.\n")
    for path in (root / "team" / "plan.md", root / "readme.txt"):
        path.chmod(0o640)
    names_map = {f"uid:{os.getuid()}": "user:alice", "gid:100": "group:staff"}
    await operator.create(tenant(t))
    await operator.ready("Tenant", t)
    await operator.create(source("share", t, connection={"path": str(root)}, permissions="from-source",
                                 permissionMap=names_map, acl={"groups": ["auditors"]}))
    await operator.ready("Source", "share", "kdbl")
    row = _row(owner_engine, t, "share")
    assert row["acl_mode"] == "source" and row["permission_map"] == names_map
    assert "honor_file_permissions" not in row["config"]
    assert _grants(owner_engine, row["id"]) == {"group:auditors"}  # grants add readers in every mode

    crawl(worker_engine, Corpus(t, row["tenant_id"], row["id"], root))
    sets = _sets(owner_engine, row["id"])
    assert set(sets) == {"team/plan.md", "readme.txt"} and all(rules is not None for rules in sets.values())
    assert all("user:alice" in json.dumps(rules) for rules in sets.values())  # the owner, through the map

    # the map is converged like every other column: a change behind the operator's back is corrected
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE sources SET permission_map = '{}' WHERE id = :s"), {"s": row["id"]})
    await operator.eventually(lambda: _row(owner_engine, t, "share")["permission_map"] == names_map,
                              what="permission_map drift corrected")

    # back to the tenant: acl_mode follows and the files keep none of the share's permissions
    await operator.patch("Source", "share", {"spec": {"permissions": "tenant"}}, "kdbl")
    await operator.eventually(lambda: _row(owner_engine, t, "share")["acl_mode"] == "tenant", what="acl_mode tenant")
    assert _sets(owner_engine, row["id"]) == {"team/plan.md": None, "readme.txt": None}
    assert _grants(owner_engine, row["id"]) == {"group:auditors"}


async def test_the_deprecated_alias_and_a_refused_protocol_through_the_operator(operator, owner_engine, names):
    t = names("alias")
    await operator.create(tenant(t))
    await operator.ready("Tenant", t)
    await operator.create(source("old", t, acl={"mode": "tenant", "honorFilePermissions": True}))
    await operator.create(source("bucket", t, protocol="s3", connection={"bucket": "docs"},
                                 permissions="from-source"))
    await operator.ready("Source", "old", "kdbl")
    assert _row(owner_engine, t, "old")["acl_mode"] == "source"

    degraded = await operator.degraded("Source", "bucket", desired.INVALID_SPEC, "kdbl")
    assert degraded["message"].startswith("spec.permissions: ")
    assert _row(owner_engine, t, "bucket") is None
    await operator.patch("Source", "bucket", {"spec": {"permissions": "grants", "acl": {"groups": ["hr"]}}}, "kdbl")
    await operator.ready("Source", "bucket", "kdbl")
    assert _row(owner_engine, t, "bucket")["acl_mode"] == "restricted"
