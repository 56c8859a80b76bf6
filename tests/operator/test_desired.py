"""The pure part of the operator: custom resource → desired rows, plans and status. No cluster, no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kdbl_core.access import policy
from kdbl_core.access.principal import ALL_SCOPES
from kdbl_core.settings import OperatorSettings
from kdbl_operator import desired, election
from kdbl_operator.desired import InvalidSpec, Outcome

NOW = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def tenant_body(name: str = "acme", annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": "u-1", "generation": 3}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Tenant", "metadata": meta,
            "spec": {"displayName": "ACME", **spec}}


def source_body(name: str = "docs", namespace: str = "team-a", /, **spec: Any) -> dict[str, Any]:
    body = {"tenantRef": {"name": "acme"}, "protocol": "fs", "connection": {"path": "/data/docs"}}
    body.update(spec)
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Source", "metadata": {"name": name, "namespace": namespace},
            "spec": body}


def reason_of(call: Any) -> str:
    with pytest.raises(InvalidSpec) as exc:
        call()
    return exc.value.reason


# ------------------------------------------------------------------------------------------------
# Tenant
# ------------------------------------------------------------------------------------------------
def test_a_minimal_tenant_gets_the_crd_defaults_and_a_bootstrap_token_in_the_operator_namespace():
    want = desired.tenant(tenant_body(), operator_namespace="kdbl")
    assert want.name == "acme" and want.display_name == "ACME" and want.hybrid is True and not want.adopt
    assert want.row == {"display_name": "ACME", "hybrid_enabled": True, "settings": want.settings,
                        "managed_by": "operator"}
    assert want.settings["enabled"] is True
    assert want.settings["mcp"] == {"tools": list(desired.TOOLS), "modes": ["hybrid", "lexical"]}
    assert want.settings["operator"] == {"owner": {"kind": "Tenant", "name": "acme", "uid": "u-1"},
                                         "namespace": "kdbl", "source_namespaces": []}
    boot = want.bootstrap
    assert (boot.enabled, boot.secret_name, boot.namespace) == (True, "kdbl-tenant-acme-bootstrap", "kdbl")
    assert boot.scopes == ("kdbl.search", "kdbl.read") and boot.subject == "user:bootstrap" and boot.groups == ()
    assert want.source_namespaces == {"kdbl"}


def test_the_operator_knows_exactly_the_scopes_the_platform_has():
    assert set(desired.SCOPES) == set(ALL_SCOPES)


def test_the_operator_knows_exactly_the_tools_the_platform_has_and_defaults_to_the_six():
    assert desired.ALL_TOOLS == policy.ALL_TOOLS and desired.TOOLS == policy.TOOLS
    crd = yaml.safe_load((Path(__file__).resolve().parents[2] / "operator" / "crds" / "tenants.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert tuple(spec["properties"]["mcp"]["properties"]["tools"]["items"]["enum"]) == policy.ALL_TOOLS


def test_a_full_tenant_spec_maps_to_the_settings_document():
    want = desired.tenant(tenant_body(
        description="Finance", enabled=False, hybrid=False, namespace="acme", sourceNamespaces=["team-a", "team-a"],
        mcp={"tools": ["search_content", "get_file_text"], "modes": ["lexical"]},
        rateLimit={"requestsPerMinute": 60, "burst": 10}, admins={"principals": ["ann"], "groups": ["ops"]},
        oidc={"groups": ["acme-staff"]}, downloads={"enabled": False, "linkTtlSeconds": 120},
        quotas={"maxSources": 5, "maxBytes": 10**12},
        bootstrapToken={"secretName": "acme-pat", "scopes": ["kdbl.read"], "principal": "robot", "groups": ["bots"]},
    ), operator_namespace="kdbl")
    s = want.settings
    assert s["enabled"] is False and s["description"] == "Finance"
    assert s["mcp"] == {"tools": ["search_content", "get_file_text"], "modes": ["lexical"]}
    assert s["rate_limit"] == {"per_minute": 60, "burst": 10}
    assert s["admins"] == {"principals": ["ann"], "groups": ["ops"]}
    assert s["oidc"] == {"subjects": [], "groups": ["acme-staff"]}
    assert s["downloads"] == {"enabled": False, "link_ttl_seconds": 120}
    assert s["quotas"] == {"max_sources": 5, "max_bytes": 10**12}
    assert s["operator"]["source_namespaces"] == ["team-a"]
    assert want.source_namespaces == {"acme", "team-a"}
    boot = want.bootstrap
    assert (boot.secret_name, boot.namespace, boot.scopes) == ("acme-pat", "acme", ("kdbl.read",))
    assert boot.subject == "user:robot" and boot.groups == ("bots",)


def test_rate_tiers_and_download_modes_map_to_the_keys_the_policy_reads():
    from kdbl_core.access import policy

    s = desired.tenant(tenant_body(
        rateLimit={"requestsPerMinute": 60, "requestsPerHour": 1000, "requestsPerDay": 5000,
                   "tenant": {"requestsPerMinute": 300, "burst": 50}},
        downloads={"mode": "inline", "linkTtlSeconds": 60}), operator_namespace="kdbl").settings
    assert s["rate_limit"] == {"per_minute": 60, "per_hour": 1000, "per_day": 5000,
                               "tenant": {"per_minute": 300, "burst": 50}}
    assert s["downloads"] == {"enabled": True, "mode": "inline", "link_ttl_seconds": 60}
    effective = policy.parse(s).describe()
    assert effective["rate_limit"] == {"per_token": {"per_minute": 60, "per_hour": 1000, "per_day": 5000, "burst": 60},
                                       "tenant": {"per_minute": 300, "burst": 50}}
    assert (effective["downloads"], effective["link_ttl_seconds"]) == ("inline", 60)
    assert set(desired.TOOLS) == set(policy.TOOLS)
    assert set(desired.MODES) == set(policy.MODES) and desired.DOWNLOAD_MODES == policy.DOWNLOAD_MODES


@pytest.mark.parametrize("body,reason", [
    (tenant_body(downloads={"mode": "sometimes"}), "InvalidSpec"),
    (tenant_body(downloads={"enabled": False, "mode": "inline"}), "InvalidSpec"),
    (tenant_body(rateLimit={"requestsPerHour": -1}), "InvalidSpec"),
    (tenant_body(rateLimit={"tenant": {"burst": 0}}), "InvalidSpec"),
    (tenant_body("dotted.name"), "InvalidName"),
    (tenant_body("x" * 64), "InvalidName"),
    (tenant_body(displayName=""), "InvalidSpec"),
    (tenant_body(hybrid=True, mcp={"modes": ["lexical"]}), "InvalidSpec"),
    (tenant_body(bootstrapToken={"scopes": ["kdbl.admin"]}), "InvalidSpec"),
    (tenant_body(mcp={"tools": ["rm_rf"]}), "InvalidSpec"),
    (tenant_body(namespace="Not_A_Namespace"), "InvalidSpec"),
    (tenant_body(rateLimit={"burst": 0}), "InvalidSpec"),
    (tenant_body(hybrid="yes"), "InvalidSpec"),
])
def test_invalid_tenant_specs_name_their_reason(body, reason):
    assert reason_of(lambda: desired.tenant(body, operator_namespace="kdbl")) == reason


def test_the_adopt_annotation_is_read_as_a_boolean():
    assert desired.tenant(tenant_body(annotations={"kdbl.io/adopt": "true"}), operator_namespace="k").adopt
    assert not desired.tenant(tenant_body(annotations={"kdbl.io/adopt": "no"}), operator_namespace="k").adopt


# ------------------------------------------------------------------------------------------------
# Source
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol,connection,config", [
    ("fs", {"path": "/data/docs"}, {"root": "/data/docs"}),
    ("s3", {"bucket": "b", "endpoint": "https://minio:9000", "region": "eu", "prefix": "x/", "pathStyle": True},
     {"bucket": "b", "endpoint_url": "https://minio:9000", "region": "eu", "prefix": "x/", "path_style": True}),
    ("smb", {"server": "fs01", "share": "public", "path": "reports", "domain": "CORP", "port": 445},
     {"server": "fs01", "share": "public", "path": "reports", "domain": "CORP", "port": 445}),
    ("webdav", {"url": "https://dav.example/remote.php/dav/files/svc/"},
     {"url": "https://dav.example/remote.php/dav/files/svc/"}),
    ("http", {"url": "http://docs.internal/manuals/"}, {"url": "http://docs.internal/manuals/"}),
])
def test_each_protocols_connection_becomes_the_workers_config(protocol, connection, config):
    want = desired.source(source_body(protocol=protocol, connection=connection))
    got = {k: v for k, v in want.config.items() if k != "k8s"}
    assert got == config
    assert want.protocol == protocol and want.schedule == "@every 1h" and want.enabled is True


def test_labels_label_globs_and_s3_object_tags_become_the_source_configs_label_fields():
    want = desired.source(source_body(protocol="s3", connection={"bucket": "b"}, labels=["finance", "2024"],
                                      labelGlobs={"reports/": ["report"], "**/*.xlsx": ["sheet", "report"]},
                                      objectTags=True))
    assert want.config["labels"] == ["finance", "2024"]
    assert want.config["label_globs"] == {"reports/": ["report"], "**/*.xlsx": ["sheet", "report"]}
    assert want.config["object_tags"] is True
    bare = desired.source(source_body(labels=[], labelGlobs={}, objectTags=False))
    assert not {"labels", "label_globs", "object_tags"} & set(bare.config)


@pytest.mark.parametrize("spec,where", [
    ({"labels": ["ok", " "]}, "spec.labels"),
    ({"labels": "finance"}, "spec.labels"),
    ({"labelGlobs": {"reports/": "report"}}, "spec.labelGlobs"),
    ({"labelGlobs": {"[z-a]": ["x"]}}, "spec.labelGlobs"),  # a glob no regex can be made of
    ({"objectTags": True}, "spec.objectTags"),  # fs has no object tags
    ({"protocol": "s3", "connection": {"bucket": "b"}, "objectTags": "yes"}, "spec.objectTags"),
])
def test_a_bad_label_field_is_refused_naming_its_spec_path(spec, where):
    with pytest.raises(InvalidSpec) as exc:
        desired.source(source_body(**spec))
    assert exc.value.reason == desired.INVALID_SPEC and exc.value.message.startswith(f"{where}: "), exc.value.message


def test_credentials_travel_as_a_reference_to_the_mounted_secret_never_as_values():
    want = desired.source(source_body(protocol="s3", connection={"bucket": "b", "tls": {
        "insecureSkipVerify": True, "caSecretRef": {"name": "minio-ca"}}}, credentialsSecretRef={"name": "s3"}),
        credentials_root="/run/creds/")
    assert want.config["credentials"] == {"dir": "/run/creds/team-a/s3"}
    assert want.config["credentials_secret"] == {"namespace": "team-a", "name": "s3"}
    assert want.config["verify_tls"] is False and want.config["ca_file"] == "/run/creds/team-a/minio-ca/ca.crt"
    assert want.credentials == desired.SecretRef("team-a", "s3", ("access_key_id", "secret_access_key"))
    assert want.ca_secret == desired.SecretRef("team-a", "minio-ca", ("ca.crt",))


def test_source_name_acl_globs_hybrid_and_owner_marker():
    want = desired.source(source_body(name="handbook", include=["**/*.pdf"], exclude=["tmp/**"], maxFileBytes=1024,
                                      schedule="0  3 * * MON-FRI", hybrid=False, enabled=False,
                                      acl={"mode": "restricted", "principals": ["ann"], "groups": ["hr", "hr"]}))
    assert want.name == "handbook" and want.tenant == "acme" and want.namespace == "team-a"
    assert want.config["include"] == ["**/*.pdf"] and want.config["exclude"] == ["tmp/**"]
    assert want.config["max_file_bytes"] == 1024 and "honor_file_permissions" not in want.config
    assert want.schedule == "0 3 * * MON-FRI"
    assert want.acl_mode == "restricted" and want.grants == {"user:ann", "group:hr"}
    assert want.config["k8s"] == {"owner": {"kind": "Source", "name": "docs", "namespace": "team-a"}, "hybrid": "spec"}
    assert want.row(tenant_hybrid=True)["hybrid_enabled"] is False and want.row(True)["enabled"] is False


def test_an_unset_hybrid_toggle_follows_the_tenant():
    want = desired.source(source_body())
    assert want.hybrid is None and want.config["k8s"]["hybrid"] == "inherit"
    assert want.row(tenant_hybrid=False)["hybrid_enabled"] is False
    assert want.row(tenant_hybrid=True)["hybrid_enabled"] is True


@pytest.mark.parametrize("spec,reason", [
    ({"protocol": "ftp"}, "InvalidSpec"),
    ({"tenantRef": {}}, "InvalidSpec"),
    ({"protocol": "s3", "connection": {"prefix": "x"}}, "InvalidSpec"),
    ({"protocol": "smb", "connection": {"server": "fs01"}}, "InvalidSpec"),
    ({"protocol": "webdav", "connection": {"url": "https://user:pw@dav.example/"}}, "InvalidSpec"),
    ({"protocol": "http", "connection": {"url": "ftp://x/"}}, "InvalidSpec"),
    ({"connection": {"path": "relative/dir"}}, "InvalidSpec"),
    ({"credentialsSecretRef": {"name": "x"}}, "InvalidSpec"),  # fs takes no credentials
    ({"name": "bad name"}, "InvalidName"),
    ({"schedule": "every day"}, "InvalidSchedule"),
    ({"acl": {"mode": "everyone"}}, "InvalidSpec"),
    ({"hybrid": "inherit"}, "InvalidSpec"),
])
def test_invalid_source_specs_name_their_reason(spec, reason):
    assert reason_of(lambda: desired.source(source_body(**spec))) == reason


@pytest.mark.parametrize("value,normalised", [
    (None, "@every 1h"), ("@every 15m", "@every 15m"), ("@EVERY 1h30m", "@every 1h30m"), ("@every 90s", "@every 90s"),
    ("@daily", "@daily"), ("*/30 * * * *", "*/30 * * * *"), ("0 3 * * 1-5", "0 3 * * 1-5"),
    ("0 0 1 JAN,JUL *", "0 0 1 JAN,JUL *"), ("5,35 8-18/2 * * sun", "5,35 8-18/2 * * sun"), ("0 0 * * 7", "0 0 * * 7"),
])
def test_valid_schedules_are_normalised(value, normalised):
    assert desired.parse_schedule(value) == normalised


@pytest.mark.parametrize("value", [
    "", "every day", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
    "* * * * 8", "*/0 * * * *", "5-1 * * * *", "@every 30s", "@every 5 minutes", "@every", "@fortnightly", 42,
])
def test_invalid_schedules_are_refused(value):
    assert reason_of(lambda: desired.parse_schedule(value)) == "InvalidSchedule"


def test_a_secret_is_checked_by_its_key_names_only():
    ref = desired.SecretRef("ns", "creds", ("username", "password"))
    assert reason_of(lambda: desired.check_secret(ref, None)) == "SecretNotFound"
    with pytest.raises(InvalidSpec) as exc:
        desired.check_secret(ref, ["username"])
    assert exc.value.reason == "SecretKeysMissing" and "password" in exc.value.message
    desired.check_secret(ref, ["username", "password", "extra"])


# ------------------------------------------------------------------------------------------------
# ownership and changes
# ------------------------------------------------------------------------------------------------
MINE = {"kind": "Source", "namespace": "a", "name": "docs"}


def test_rows_are_created_updated_adopted_or_refused_by_who_owns_them():
    assert desired.claim(None, None, MINE, adopt=False, what="x") == "create"
    assert desired.claim({"managed_by": "operator"}, {**MINE, "uid": "old"}, MINE, adopt=False, what="x") == "update"
    assert desired.claim({"managed_by": "cli"}, None, MINE, adopt=True, what="x") == "adopt"
    with pytest.raises(InvalidSpec) as exc:
        desired.claim({"managed_by": "cli"}, None, MINE, adopt=False, what="source 'docs'")
    assert exc.value.reason == "NameConflict" and "kdbl.io/adopt" in exc.value.message
    with pytest.raises(InvalidSpec) as exc:
        desired.claim({"managed_by": "operator"}, {**MINE, "namespace": "b"}, MINE, adopt=True, what="x")
    assert exc.value.reason == "NameConflict" and "b/docs" in exc.value.message


def test_only_differing_columns_and_grants_are_changed():
    assert desired.changes({"a": 1, "b": {"x": 1}}, {"a": 1, "b": {"x": 2}}) == {"b": {"x": 2}}
    assert desired.grant_changes({"user:a", "group:g"}, {"group:g", "group:h"}) == (["group:h"], ["user:a"])


def test_a_tenant_accepts_sources_from_its_namespaces_only():
    settings = {"operator": {"namespace": "acme", "source_namespaces": ["team-a"]}}
    assert desired.namespace_allowed(settings, "acme") and desired.namespace_allowed(settings, "team-a")
    assert not desired.namespace_allowed(settings, "team-b")
    assert desired.namespace_allowed({"operator": {"namespace": "x", "source_namespaces": ["*"]}}, "any")


@pytest.mark.parametrize("kwargs,plan", [
    ({"secret_lookup_id": None, "secret_has_token": False, "active_lookup_ids": []}, ("mint", "missing", ())),
    ({"secret_lookup_id": None, "secret_has_token": False, "active_lookup_ids": ["a"]}, ("mint", "missing", ("a",))),
    ({"secret_lookup_id": "x", "secret_has_token": True, "active_lookup_ids": ["a"]}, ("mint", "unknown", ("a",))),
    ({"secret_lookup_id": "a", "secret_has_token": False, "active_lookup_ids": ["a"]}, ("mint", "missing", ("a",))),
    ({"secret_lookup_id": "a", "secret_has_token": True, "active_lookup_ids": ["a", "b"]}, ("keep", "", ("b",))),
    ({"secret_lookup_id": "a", "secret_has_token": True, "active_lookup_ids": ["a"], "rotate_to": "r1",
      "rotated": "r1"}, ("keep", "", ())),
    ({"secret_lookup_id": "a", "secret_has_token": True, "active_lookup_ids": ["a"], "rotate_to": "r2",
      "rotated": "r1"}, ("mint", "rotation", ("a",))),
])
def test_the_bootstrap_token_is_minted_only_when_missing_unknown_or_rotation_is_requested(kwargs, plan):
    got = desired.plan_bootstrap(**{"rotate_to": None, "rotated": None, **kwargs})
    assert (got.action, got.why, got.revoke) == plan


# ------------------------------------------------------------------------------------------------
# status
# ------------------------------------------------------------------------------------------------
def test_conditions_say_ready_reconciling_and_degraded_and_keep_transition_times():
    ready = desired.conditions(None, Outcome(), generation=2, now=NOW)
    by = {c["type"]: c for c in ready}
    assert (by["Ready"]["status"], by["Reconciling"]["status"], by["Degraded"]["status"]) == ("True", "False", "False")
    assert all(c["observedGeneration"] == 2 and c["lastTransitionTime"] == "2025-03-01T12:00:00Z" for c in ready)

    later = NOW + timedelta(minutes=5)
    again = desired.conditions(ready, Outcome(), generation=2, now=later)
    assert again == ready  # nothing changed, nothing to write

    bad = InvalidSpec("SecretNotFound", "Secret a/b does not exist")
    degraded = {c["type"]: c for c in desired.conditions(ready, Outcome(degraded=bad), generation=2, now=later)}
    assert degraded["Ready"] == {"type": "Ready", "status": "False", "reason": "SecretNotFound",
                                 "message": "Secret a/b does not exist", "lastTransitionTime": "2025-03-01T12:05:00Z",
                                 "observedGeneration": 2}
    assert degraded["Reconciling"]["status"] == "True" and degraded["Reconciling"]["reason"] == "Retrying"
    assert degraded["Degraded"]["reason"] == "SecretNotFound"

    permanent = {c["type"]: c for c in desired.conditions(
        None, Outcome(degraded=InvalidSpec("InvalidSchedule", "x")), generation=None, now=NOW)}
    assert permanent["Reconciling"]["status"] == "False" and "observedGeneration" not in permanent["Ready"]
    deleting = {c["type"]: c for c in desired.conditions(None, Outcome(deleting=True, message="3 left"),
                                                         generation=1, now=NOW)}
    assert deleting["Reconciling"]["reason"] == "Deleting" and deleting["Ready"]["status"] == "False"
    assert desired.phase(Outcome(deleting=True)) == "Deleting" and desired.phase(Outcome(degraded=bad)) == "Degraded"


def test_the_status_patch_holds_only_what_changed():
    assert desired.status_patch({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": None}) == {"b": 3}
    assert desired.status_patch(None, {"a": 1}) == {"a": 1}


def test_events_are_posted_on_transitions_only():
    ready = desired.conditions(None, Outcome(), generation=1, now=NOW)
    assert desired.transition(None, Outcome()) == ("Normal", "Reconciled", "the database matches the spec")
    assert desired.transition(ready, Outcome()) is None
    bad = InvalidSpec("TenantNotFound", "no tenant 'x'")
    assert desired.transition(ready, Outcome(degraded=bad)) == ("Warning", "TenantNotFound", "no tenant 'x'")
    degraded = desired.conditions(ready, Outcome(degraded=bad), generation=1, now=NOW)
    assert desired.transition(degraded, Outcome(degraded=bad)) is None
    assert desired.transition(degraded, Outcome())[1] == "Reconciled"


def test_retryable_reasons_are_those_that_depend_on_other_objects():
    assert InvalidSpec("TenantNotFound", "").temporary and InvalidSpec("SecretNotFound", "").temporary
    assert InvalidSpec("NameConflict", "").temporary and InvalidSpec("DatabaseUnavailable", "").temporary
    assert not InvalidSpec("InvalidSchedule", "").temporary and not InvalidSpec("InvalidSpec", "").temporary


def test_embedding_progress_is_a_percentage():
    assert desired.embedding_progress(0, 0) == 100
    assert desired.embedding_progress(1, 3) == 33 and desired.embedding_progress(3, 3) == 100


def test_retry_backoff_grows_and_is_capped():
    cfg = OperatorSettings(retry_base_seconds=5, retry_max_seconds=300)
    assert [cfg.backoff(r) for r in (0, 1, 2, 10, 1000)] == [5, 10, 20, 300, 300]


# ------------------------------------------------------------------------------------------------
# leader election decisions
# ------------------------------------------------------------------------------------------------
def lease(holder: str | None, renewed: datetime | None, duration: float = 15) -> election.LeaseView:
    return election.LeaseView(holder=holder, renew_time=renewed, duration=duration, transitions=0,
                              acquire_time=None, resource_version="1")


def test_a_lease_is_created_renewed_taken_over_when_expired_and_otherwise_waited_for():
    assert election.decide(None, "me", NOW) == "create"
    assert election.decide(lease("me", NOW - timedelta(seconds=60)), "me", NOW) == "renew"
    assert election.decide(lease("other", NOW - timedelta(seconds=5)), "me", NOW) == "wait"
    assert election.decide(lease("other", NOW - timedelta(seconds=16)), "me", NOW) == "takeover"
    assert election.decide(lease(None, NOW), "me", NOW) == "takeover"


def test_lease_times_are_parsed_from_the_api_format():
    view = election.parse({"metadata": {"resourceVersion": "7"}, "spec": {
        "holderIdentity": "a", "renewTime": "2025-03-01T12:00:00.123456Z", "leaseDurationSeconds": 15,
        "leaseTransitions": 2}})
    assert view.holder == "a" and view.renew_time == NOW + timedelta(microseconds=123456)
    assert view.resource_version == "7" and view.transitions == 2
    assert election.micro_time(NOW) == "2025-03-01T12:00:00.000000Z"
