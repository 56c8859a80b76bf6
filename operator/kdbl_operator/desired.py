"""Pure translation of Tenant / Source custom resources into the rows the database should hold.

Nothing here performs I/O: every function takes plain dicts (a CR body, a current row) and returns
plain values or raises `InvalidSpec`. The handlers feed the results to `kdbl_operator.db_sync`
and the status back to Kubernetes, so everything that decides *what* should happen is unit-tested
without a cluster or a database (tests/operator/test_desired.py).

The CRDs' defaults are repeated here on purpose: a real API server applies them, but the operator
must not depend on defaulting (older objects, emulators, `kubectl replace` of a trimmed object).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kdbl_core import sources
from kdbl_core.access import share_acl
from kdbl_core.errors import INVALID_PARAMS, ConfigError, InvalidArgument, KdblError
from kdbl_core.sources.schedule import ScheduleError

GROUP = "kdbl.io"
VERSION = "v1alpha1"
MANAGED_BY = "operator"

# User-facing annotations (kopf's own bookkeeping lives under kopf.kdbl.io/, see handlers).
ANNOTATION_ADOPT = "kdbl.io/adopt"
ANNOTATION_ROTATE = "kdbl.io/rotate-bootstrap-token"
ANNOTATION_LOOKUP_ID = "kdbl.io/token-lookup-id"
LABEL_TENANT = "kdbl.io/tenant"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kdbl-operator"

TENANT_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")  # tenants.name CHECK in 0001
DNS_LABEL = TENANT_NAME
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
SOURCE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?$")

TOOLS = ("search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files")
ALL_TOOLS = TOOLS + ("get_contents", "find_similar", "answer", "find_entity")  # kdbl_core.access.policy (a unit test keeps them equal)
MODES = ("hybrid", "lexical")
DOWNLOAD_MODES = ("off", "inline", "attachment")  # kdbl_core.access.policy.DOWNLOAD_MODES
SCOPES = ("kdbl.search", "kdbl.read")  # kdbl_core.access.principal.ALL_SCOPES (a unit test keeps them equal)
# kdbl_core.access.policy's IN_FLIGHT_RANGE, QUEUE_MS_RANGE, DEADLINE_MS_RANGE (a unit test keeps them equal)
IN_FLIGHT_RANGE = (1, 1000)
QUEUE_MS_RANGE = (0, 60_000)
DEADLINE_MS_RANGE = (100, 3_600_000)
PROTOCOLS = sources.PROTOCOLS
# Keys the worker reads from a mounted credentials Secret (one file per key), per protocol: the required names
# of the one source-config schema.
CREDENTIAL_KEYS: dict[str, tuple[str, ...]] = {p: names[0] for p, names in sources.CREDENTIAL_NAMES.items()}
DEFAULT_CREDENTIALS_ROOT = "/var/run/secrets/kdbl/sources"

# Degraded reasons. RETRYABLE ones depend on *other* objects (another CR, a Secret, a namespace) and
# are retried with backoff; the others only change when this object's spec changes.
TENANT_NOT_FOUND = "TenantNotFound"
TENANT_NOT_MANAGED = "TenantNotManaged"
NAMESPACE_NOT_ALLOWED = "NamespaceNotAllowed"
NAMESPACE_NOT_FOUND = "NamespaceNotFound"
SECRET_NOT_FOUND = "SecretNotFound"
SECRET_KEYS_MISSING = "SecretKeysMissing"
NAME_CONFLICT = "NameConflict"
INVALID_SCHEDULE = "InvalidSchedule"
INVALID_NAME = "InvalidName"
INVALID_SPEC = "InvalidSpec"
DATABASE_UNAVAILABLE = "DatabaseUnavailable"
KUBERNETES_UNAVAILABLE = "KubernetesUnavailable"
INTERNAL_ERROR = "InternalError"
RETRYABLE = frozenset({TENANT_NOT_FOUND, TENANT_NOT_MANAGED, NAMESPACE_NOT_ALLOWED, NAMESPACE_NOT_FOUND,
                       SECRET_NOT_FOUND, SECRET_KEYS_MISSING, NAME_CONFLICT, DATABASE_UNAVAILABLE,
                       KUBERNETES_UNAVAILABLE, INTERNAL_ERROR})


class InvalidSpec(KdblError):
    """The object cannot be converged as written; `reason` is the Degraded condition's reason. Temporary
    (kopf retries with backoff) when the reason depends on another object or a dependency (RETRYABLE),
    permanent (wait for the spec to change) otherwise."""

    jsonrpc_code = INVALID_PARAMS
    http_status = 422

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, data={"reason": reason})
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"

    @property
    def temporary(self) -> bool:  # type: ignore[override]
        return self.reason in RETRYABLE


# ------------------------------------------------------------------------------------------------
# small helpers
# ------------------------------------------------------------------------------------------------
def _obj(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(INVALID_SPEC, f"{where} must be an object")
    return dict(value)


def _strings(value: Any, where: str, *, allowed: Sequence[str] | None = None) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSpec(INVALID_SPEC, f"{where} must be a list of non-empty strings")
    if allowed is not None:
        unknown = [v for v in value if v not in allowed]
        if unknown:
            raise InvalidSpec(INVALID_SPEC, f"{where}: unknown value(s) {', '.join(unknown)} "
                                            f"(known: {', '.join(allowed)})")
    out: list[str] = []
    for v in value:  # de-duplicate, keep order
        if v not in out:
            out.append(v)
    return out


def _bool(value: Any, where: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidSpec(INVALID_SPEC, f"{where} must be true or false")
    return value


def _int(value: Any, where: str, *, low: int, high: int | None = None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f">= {low}"
        raise InvalidSpec(INVALID_SPEC, f"{where} must be an integer {bound}")
    return value


def _subject_part(value: str, where: str) -> str:
    if "\x1f" in value:  # the separator of kdbl.subjects (kdbl_core.db.connect)
        raise InvalidSpec(INVALID_SPEC, f"{where}: a value contains a control character")
    return value


# ------------------------------------------------------------------------------------------------
# schedules: the one parser (kdbl_core.sources.schedule)
# ------------------------------------------------------------------------------------------------
def parse_schedule(value: Any) -> str:
    """Validate a crawl schedule and return the normalised text that is stored (as kdbl-control does)."""
    try:
        return sources.parse_schedule(value).text
    except ScheduleError as exc:
        raise InvalidSpec(INVALID_SCHEDULE, f"spec.schedule: {exc.message.split(': ', 1)[-1]}") from None


# ------------------------------------------------------------------------------------------------
# Tenant
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BootstrapToken:
    enabled: bool
    secret_name: str
    namespace: str
    scopes: tuple[str, ...]
    subject: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class DesiredTenant:
    name: str
    display_name: str
    hybrid: bool
    settings: dict[str, Any]
    namespace: str
    source_namespaces: frozenset[str]
    bootstrap: BootstrapToken
    adopt: bool

    @property
    def row(self) -> dict[str, Any]:
        """Column values of the tenants row."""
        return {"display_name": self.display_name, "hybrid_enabled": self.hybrid, "settings": self.settings,
                "managed_by": MANAGED_BY}


def _meta(body: Mapping[str, Any]) -> dict[str, Any]:
    return dict(body.get("metadata") or {})


def _annotations(body: Mapping[str, Any]) -> dict[str, str]:
    return dict(_meta(body).get("annotations") or {})


def adopt_requested(body: Mapping[str, Any]) -> bool:
    return _annotations(body).get(ANNOTATION_ADOPT, "").strip().lower() in ("true", "yes", "1")


def owner_marker(body: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(body)
    marker = {"kind": body.get("kind") or "", "name": meta.get("name") or ""}
    if meta.get("namespace"):
        marker["namespace"] = meta["namespace"]
    if meta.get("uid"):
        marker["uid"] = meta["uid"]
    return marker


def _rate_tiers(rate: Mapping[str, Any], where: str) -> dict[str, int]:
    """{requestsPerMinute, requestsPerHour, requestsPerDay, burst} -> the settings keys kdbl_core.access.policy reads."""
    tiers = {snake: _int(rate.get(camel), f"{where}.{camel}", low=low) for camel, snake, low in (
        ("requestsPerMinute", "per_minute", 0), ("requestsPerHour", "per_hour", 0),
        ("requestsPerDay", "per_day", 0), ("burst", "burst", 1))}
    return {k: v for k, v in tiers.items() if v is not None}


def _limits(spec: Mapping[str, Any]) -> dict[str, Any]:
    """spec.concurrency and spec.deadlines -> the settings keys kdbl_core.access.policy reads (absent: none)."""
    concurrency = _obj(spec.get("concurrency"), "spec.concurrency")
    deadlines = _obj(spec.get("deadlines"), "spec.deadlines")
    tools = _obj(deadlines.get("tools"), "spec.deadlines.tools")
    unknown = [t for t in tools if t not in ALL_TOOLS]
    if unknown:
        raise InvalidSpec(INVALID_SPEC, f"spec.deadlines.tools: unknown tool(s) {', '.join(unknown)} "
                                        f"(known: {', '.join(ALL_TOOLS)})")
    low, high = DEADLINE_MS_RANGE
    share = {"max_in_flight": _int(concurrency.get("maxInFlight"), "spec.concurrency.maxInFlight",
                                   low=IN_FLIGHT_RANGE[0], high=IN_FLIGHT_RANGE[1]),
             "queue_ms": _int(concurrency.get("queueMilliseconds"), "spec.concurrency.queueMilliseconds",
                              low=QUEUE_MS_RANGE[0], high=QUEUE_MS_RANGE[1])}
    own = {t: _int(tools[t], f"spec.deadlines.tools.{t}", low=low, high=high) for t in ALL_TOOLS if t in tools}
    deadline = {"default_ms": _int(deadlines.get("defaultMilliseconds"), "spec.deadlines.defaultMilliseconds",
                                   low=low, high=high),
                "tools": {t: ms for t, ms in own.items() if ms is not None} or None}
    out: dict[str, Any] = {}
    if any(v is not None for v in share.values()):
        out["concurrency"] = {k: v for k, v in share.items() if v is not None}
    if any(v is not None for v in deadline.values()):
        out["deadlines"] = {k: v for k, v in deadline.items() if v is not None}
    return out


def tenant(body: Mapping[str, Any], *, operator_namespace: str) -> DesiredTenant:
    """The tenants row (and bootstrap-token plan) a Tenant resource asks for."""
    name = _meta(body).get("name") or ""
    if not TENANT_NAME.match(name):
        raise InvalidSpec(INVALID_NAME, f"tenant name '{name}' must be 1-63 lower-case letters, digits and '-', "
                                        "starting and ending with a letter or digit")
    spec = _obj(body.get("spec"), "spec")
    display = spec.get("displayName")
    if not isinstance(display, str) or not display.strip():
        raise InvalidSpec(INVALID_SPEC, "spec.displayName is required")
    namespace = spec.get("namespace") or operator_namespace
    if not isinstance(namespace, str) or not DNS_LABEL.match(namespace):
        raise InvalidSpec(INVALID_SPEC, f"spec.namespace '{namespace}' is not a namespace name")
    source_namespaces = _strings(spec.get("sourceNamespaces"), "spec.sourceNamespaces")
    for ns in source_namespaces:
        if ns != "*" and not DNS_LABEL.match(ns):
            raise InvalidSpec(INVALID_SPEC, f"spec.sourceNamespaces: '{ns}' is not a namespace name")

    mcp = _obj(spec.get("mcp"), "spec.mcp")
    tools = _strings(mcp.get("tools"), "spec.mcp.tools", allowed=ALL_TOOLS) or list(TOOLS)
    modes = _strings(mcp.get("modes"), "spec.mcp.modes", allowed=MODES) or list(MODES)
    hybrid = _bool(spec.get("hybrid"), "spec.hybrid", True)
    rate = _obj(spec.get("rateLimit"), "spec.rateLimit")
    admins = _obj(spec.get("admins"), "spec.admins")
    oidc = _obj(spec.get("oidc"), "spec.oidc")
    downloads = _obj(spec.get("downloads"), "spec.downloads")
    quotas = _obj(spec.get("quotas"), "spec.quotas")

    settings: dict[str, Any] = {
        "enabled": _bool(spec.get("enabled"), "spec.enabled", True),
        "mcp": {"tools": tools, "modes": modes},
        "admins": {"principals": _strings(admins.get("principals"), "spec.admins.principals"),
                   "groups": _strings(admins.get("groups"), "spec.admins.groups")},
        "oidc": {"subjects": _strings(oidc.get("subjects"), "spec.oidc.subjects"),
                 "groups": _strings(oidc.get("groups"), "spec.oidc.groups")},
        "downloads": {"enabled": _bool(downloads.get("enabled"), "spec.downloads.enabled", True)},  # + mode below
        "operator": {"owner": owner_marker(body), "namespace": namespace, "source_namespaces": source_namespaces},
    }
    if spec.get("description"):
        settings["description"] = str(spec["description"])
    rate_limit = _rate_tiers(rate, "spec.rateLimit")
    tenant_rate = _rate_tiers(_obj(rate.get("tenant"), "spec.rateLimit.tenant"), "spec.rateLimit.tenant")
    if tenant_rate:
        rate_limit["tenant"] = tenant_rate
    if rate_limit:
        settings["rate_limit"] = rate_limit
    mode = downloads.get("mode")
    if mode is not None:
        if mode not in DOWNLOAD_MODES:
            raise InvalidSpec(INVALID_SPEC, f"spec.downloads.mode must be one of {', '.join(DOWNLOAD_MODES)}")
        if downloads.get("enabled") is False and mode != "off":
            raise InvalidSpec(INVALID_SPEC, "spec.downloads.enabled is false but spec.downloads.mode is not 'off'")
        settings["downloads"] = {"enabled": mode != "off", "mode": mode}
    ttl = _int(downloads.get("linkTtlSeconds"), "spec.downloads.linkTtlSeconds", low=10, high=86400)
    if ttl is not None:
        settings["downloads"]["link_ttl_seconds"] = ttl
    quota = {snake: _int(quotas.get(camel), f"spec.quotas.{camel}", low=0)
             for camel, snake in (("maxSources", "max_sources"), ("maxFiles", "max_files"), ("maxBytes", "max_bytes"))}
    if any(v is not None for v in quota.values()):
        settings["quotas"] = {k: v for k, v in quota.items() if v is not None}
    settings.update(_limits(spec))
    if hybrid and "hybrid" not in modes:
        raise InvalidSpec(INVALID_SPEC, "spec.hybrid is true but spec.mcp.modes does not allow 'hybrid'")

    boot = _obj(spec.get("bootstrapToken"), "spec.bootstrapToken")
    secret_name = boot.get("secretName") or f"kdbl-tenant-{name}-bootstrap"
    if not isinstance(secret_name, str) or not DNS_SUBDOMAIN.match(secret_name):
        raise InvalidSpec(INVALID_SPEC, f"spec.bootstrapToken.secretName '{secret_name}' is not a Secret name")
    scopes = _strings(boot.get("scopes"), "spec.bootstrapToken.scopes", allowed=SCOPES) or list(SCOPES)
    principal = boot.get("principal") or "bootstrap"
    if not isinstance(principal, str) or "\x1f" in principal:
        raise InvalidSpec(INVALID_SPEC, "spec.bootstrapToken.principal must be a user name")
    groups = [_subject_part(g, "spec.bootstrapToken.groups")
              for g in _strings(boot.get("groups"), "spec.bootstrapToken.groups")]
    bootstrap = BootstrapToken(
        enabled=_bool(boot.get("enabled"), "spec.bootstrapToken.enabled", True), secret_name=secret_name,
        namespace=namespace, scopes=tuple(scopes), subject=f"user:{principal}", groups=tuple(groups))
    return DesiredTenant(name=name, display_name=display.strip(), hybrid=hybrid, settings=settings,
                         namespace=namespace, source_namespaces=frozenset([namespace, *source_namespaces]),
                         bootstrap=bootstrap, adopt=adopt_requested(body))


# ------------------------------------------------------------------------------------------------
# Source
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecretRef:
    namespace: str
    name: str
    required_keys: tuple[str, ...]


@dataclass(frozen=True)
class DesiredSource:
    tenant: str
    name: str
    namespace: str
    protocol: str
    config: dict[str, Any]
    enabled: bool
    hybrid: bool | None  # None: inherit the tenant's toggle
    acl_mode: str  # tenant | restricted | source (spec.permissions tenant | grants | from-source)
    grants: frozenset[str]
    schedule: str
    credentials: SecretRef | None
    ca_secret: SecretRef | None
    adopt: bool
    permission_map: dict[str, str] = field(default_factory=dict)  # spec.permissionMap

    def row(self, tenant_hybrid: bool) -> dict[str, Any]:
        """Column values of the sources row, given the tenant's hybrid toggle (for inheritance)."""
        return {"protocol": self.protocol, "config": self.config, "enabled": self.enabled,
                "hybrid_enabled": tenant_hybrid if self.hybrid is None else self.hybrid,
                "acl_mode": self.acl_mode, "permission_map": self.permission_map, "schedule": self.schedule,
                "managed_by": MANAGED_BY}


# Where a stored config field comes from in a Source's spec (for messages); others: spec.connection.<field>.
_SPEC_PATH = {
    "root": "spec.connection.path", "endpoint_url": "spec.connection.endpoint",
    "path_style": "spec.connection.pathStyle", "credentials": "spec.credentialsSecretRef",
    "verify_tls": "spec.connection.tls.insecureSkipVerify", "ca_file": "spec.connection.tls.caSecretRef",
    "include": "spec.include", "exclude": "spec.exclude", "max_file_bytes": "spec.maxFileBytes", "ocr": "spec.ocr",
    "protocol": "spec.protocol", "config": "spec",
    "labels": "spec.labels", "label_globs": "spec.labelGlobs", "object_tags": "spec.objectTags",
    "follow_symlinks": "spec.followSymlinks", "permission_checks": "spec.permissionChecks",
    "permission_full_check_hours": "spec.permissionFullCheckHours", "entities": "spec.entities",
}


def _connection(protocol: str, conn: Mapping[str, Any]) -> dict[str, Any]:
    """spec.connection (the CRD's names) -> the stored config's field names."""
    if protocol == "fs":
        return {"root": conn.get("path")}
    if protocol == "s3":
        return {"bucket": conn.get("bucket"), "prefix": conn.get("prefix"), "endpoint_url": conn.get("endpoint"),
                "region": conn.get("region"), "path_style": conn.get("pathStyle")}
    if protocol == "smb":
        return {key: conn.get(key) for key in ("server", "share", "path", "port", "domain")}
    return {"url": conn.get("url")}


def _config(protocol: str, **intent: Any) -> dict[str, Any]:
    """The stored config for an intent (kdbl_core.sources.build, the schema kdbl-control and the connectors
    use); a refused field becomes InvalidSpec naming its spec path."""
    try:
        return sources.build(protocol, **intent).stored
    except InvalidArgument as exc:
        where = _SPEC_PATH.get(exc.field, f"spec.connection.{exc.field}")
        raise InvalidSpec(INVALID_SPEC, f"{where}: {exc.message.split(': ', 1)[-1]}") from None


def connection_config(protocol: str, conn: Mapping[str, Any]) -> dict[str, Any]:
    """spec.connection -> the worker's source config keys (the connection part of `source`)."""
    return _config(protocol, **_connection(protocol, conn))


def permissions(spec: Mapping[str, Any], protocol: str) -> str:
    """sources.acl_mode for a Source's spec (issue 30): spec.permissions when set; else the deprecated
    spec.acl.honorFilePermissions true (from-source); else spec.acl.mode (tenant | restricted, as before).

    spec.acl.mode tenant and honorFilePermissions false are the CRD's defaults (an API server writes them
    whenever spec.acl is set), so they never contradict spec.permissions; acl.mode restricted or
    honorFilePermissions true saying otherwise than spec.permissions, or both set, is refused naming both
    fields. from-source on a protocol whose listing carries no per-file readers (s3, webdav, http) is refused
    naming the field that asked for it."""
    acl = _obj(spec.get("acl"), "spec.acl")
    mode = acl.get("mode") or "tenant"
    if mode not in ("tenant", "restricted"):
        raise InvalidSpec(INVALID_SPEC, f"spec.acl.mode '{mode}' must be tenant or restricted")
    honor = _bool(acl.get("honorFilePermissions"), "spec.acl.honorFilePermissions", False)
    wanted = spec.get("permissions")
    if wanted is not None:
        if wanted not in share_acl.PERMISSION_MODES:
            raise InvalidSpec(INVALID_SPEC, f"spec.permissions '{wanted}' must be one of "
                                            f"{', '.join(share_acl.PERMISSION_MODES)}")
        if honor and wanted != "from-source":
            raise InvalidSpec(INVALID_SPEC, f"spec.permissions is {wanted} but spec.acl.honorFilePermissions "
                                            "(deprecated: permissions from-source) is true; remove "
                                            "spec.acl.honorFilePermissions")
        if mode == "restricted" and wanted != "grants":
            raise InvalidSpec(INVALID_SPEC, f"spec.permissions is {wanted} but spec.acl.mode is restricted "
                                            "(permissions grants); remove spec.acl.mode")
        where = "spec.permissions"
    elif honor:
        if mode == "restricted":
            raise InvalidSpec(INVALID_SPEC, "spec.acl.honorFilePermissions (deprecated: permissions "
                                            "from-source) contradicts spec.acl.mode restricted (permissions "
                                            "grants); set spec.permissions instead of both")
        wanted, where = "from-source", "spec.acl.honorFilePermissions"
    else:
        wanted, where = share_acl.PERMISSIONS_OF_MODE[mode], "spec.acl.mode"
    try:
        return share_acl.acl_mode(wanted, protocol)
    except InvalidArgument as exc:
        why = exc.reason.split("; use --permissions", 1)[0]  # the rest is the CLI's advice
        if where == "spec.acl.honorFilePermissions":
            why += " (true means permissions from-source); remove it, or"
        else:
            why += ";"
        raise InvalidSpec(INVALID_SPEC, f"{where}: {why} use spec.permissions grants and grant the source "
                                        "with spec.acl.principals / spec.acl.groups") from None


def permission_map(value: Any) -> dict[str, str]:
    """spec.permissionMap -> sources.permission_map: 'uid:N' / 'gid:N' / a SID -> 'user:NAME', 'group:NAME',
    'sid:S-...' or '*' (validated as kdbl-control does: kdbl_core.access.share_acl.PrincipalMap)."""
    names = _obj(value, "spec.permissionMap")
    bad = [k for k, v in names.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise InvalidSpec(INVALID_SPEC, f"spec.permissionMap: {bad[0]!r} must map to a string")
    try:
        share_acl.PrincipalMap(dict(names), host_names=False)
    except ConfigError as exc:
        why = exc.message.removeprefix("permission map: ")
        raise InvalidSpec(INVALID_SPEC, f"spec.permissionMap: {why}") from None
    return names


def source(body: Mapping[str, Any], *, credentials_root: str = DEFAULT_CREDENTIALS_ROOT) -> DesiredSource:
    """The sources row, grants and Secret references a Source resource asks for."""
    meta = _meta(body)
    namespace = meta.get("namespace") or "default"
    spec = _obj(body.get("spec"), "spec")
    tenant_ref = _obj(spec.get("tenantRef"), "spec.tenantRef")
    tenant_name = tenant_ref.get("name")
    if not isinstance(tenant_name, str) or not tenant_name:
        raise InvalidSpec(INVALID_SPEC, "spec.tenantRef.name is required")
    name = spec.get("name") or meta.get("name") or ""
    if not isinstance(name, str) or not SOURCE_NAME.match(name):
        raise InvalidSpec(INVALID_NAME, f"source name '{name}' must be 1-128 letters, digits, '.', '_' or '-'")
    protocol = spec.get("protocol")
    if protocol not in PROTOCOLS:
        raise InvalidSpec(INVALID_SPEC, f"spec.protocol '{protocol}' is not one of {', '.join(PROTOCOLS)}")
    conn = _obj(spec.get("connection"), "spec.connection")
    intent = _connection(protocol, conn)

    root = credentials_root.rstrip("/")
    credentials: SecretRef | None = None
    cred_ref = spec.get("credentialsSecretRef")
    if cred_ref is not None:
        secret = _obj(cred_ref, "spec.credentialsSecretRef").get("name")
        if not isinstance(secret, str) or not DNS_SUBDOMAIN.match(secret):
            raise InvalidSpec(INVALID_SPEC, "spec.credentialsSecretRef.name must be a Secret name")
        if protocol != "fs":  # fs: the schema refuses credentials, naming spec.credentialsSecretRef
            credentials = SecretRef(namespace, secret, CREDENTIAL_KEYS[protocol])
        # Only the reference travels: the worker reads the mounted Secret, one file per key.
        intent["credentials"] = {"dir": f"{root}/{namespace}/{secret}"}
        intent["credentials_secret"] = {"namespace": namespace, "name": secret}
    tls = _obj(conn.get("tls"), "spec.connection.tls")
    ca_secret: SecretRef | None = None
    intent["verify_tls"] = not _bool(tls.get("insecureSkipVerify"), "spec.connection.tls.insecureSkipVerify",
                                     False)
    if tls.get("caSecretRef") is not None:
        ca = _obj(tls["caSecretRef"], "spec.connection.tls.caSecretRef")
        ca_name, ca_key = ca.get("name"), ca.get("key") or "ca.crt"
        if not isinstance(ca_name, str) or not DNS_SUBDOMAIN.match(ca_name):
            raise InvalidSpec(INVALID_SPEC, "spec.connection.tls.caSecretRef.name must be a Secret name")
        ca_secret = SecretRef(namespace, ca_name, (ca_key,))
        intent["ca_file"] = f"{root}/{namespace}/{ca_name}/{ca_key}"
    intent.update(include=spec.get("include"), exclude=spec.get("exclude"),
                  max_file_bytes=spec.get("maxFileBytes"), ocr=spec.get("ocr"))  # ocr false: images and scanned PDF pages stay unread
    intent["follow_symlinks"] = spec.get("followSymlinks")  # fs: links inside the root (never out of it)
    # smb from-source: descriptors read at every crawl, or when the change time moved (kdbl_core.sources.config)
    intent.update(permission_checks=spec.get("permissionChecks"),
                  permission_full_check_hours=spec.get("permissionFullCheckHours"))
    intent["entities"] = spec.get("entities")  # named entities read behind the crawl (issue 31)
    # labels: every file's, a glob's files', S3 object tags (a change of the first two relabels the files)
    intent.update(labels=spec.get("labels"), label_globs=spec.get("labelGlobs") or None)
    if spec.get("objectTags") not in (None, False):
        if protocol != "s3":
            raise InvalidSpec(INVALID_SPEC, "spec.objectTags: only protocol s3 has object tags")
        intent["object_tags"] = spec["objectTags"]

    hybrid = spec.get("hybrid")
    if hybrid is not None and not isinstance(hybrid, bool):
        raise InvalidSpec(INVALID_SPEC, "spec.hybrid must be true, false or unset (inherit the tenant's)")
    acl = _obj(spec.get("acl"), "spec.acl")
    mode = permissions(spec, protocol)
    names = permission_map(spec.get("permissionMap"))
    # whole-source grants: the only readers (restricted), or readers on top of the tenant / the share's own
    grants = {f"user:{_subject_part(p, 'spec.acl.principals')}"
              for p in _strings(acl.get("principals"), "spec.acl.principals")}
    grants |= {f"group:{_subject_part(g, 'spec.acl.groups')}" for g in _strings(acl.get("groups"), "spec.acl.groups")}
    # spec.acl.honorFilePermissions now says permissions from-source (acl_mode 'source'); no longer copied
    # into the config, where it meant nothing (a row that held it changes acl_mode in the same update)
    config = _config(protocol, **intent)

    config["k8s"] = {"owner": owner_marker(body), "hybrid": "inherit" if hybrid is None else "spec"}
    return DesiredSource(
        tenant=tenant_name, name=name, namespace=namespace, protocol=protocol, config=config,
        enabled=_bool(spec.get("enabled"), "spec.enabled", True), hybrid=hybrid, acl_mode=mode,
        grants=frozenset(grants), schedule=parse_schedule(spec.get("schedule")),
        credentials=credentials, ca_secret=ca_secret, adopt=adopt_requested(body), permission_map=names)


def check_secret(ref: SecretRef, keys: Iterable[str] | None) -> None:
    """`keys`: the data keys of the Secret (None when it does not exist). Values are never looked at."""
    if keys is None:
        raise InvalidSpec(SECRET_NOT_FOUND, f"Secret {ref.namespace}/{ref.name} does not exist")
    missing = [k for k in ref.required_keys if k not in set(keys)]
    if missing:
        raise InvalidSpec(SECRET_KEYS_MISSING,
                          f"Secret {ref.namespace}/{ref.name} lacks key(s) {', '.join(missing)}")


# ------------------------------------------------------------------------------------------------
# Ownership: who may converge an existing row
# ------------------------------------------------------------------------------------------------
def same_owner(marker: Mapping[str, Any] | None, mine: Mapping[str, Any]) -> bool:
    """The row was written for this custom resource (kind, namespace, name; uid when both know it)."""
    if not marker:
        return False
    return all(marker.get(k) == mine.get(k) for k in ("kind", "namespace", "name"))


def claim(row: Mapping[str, Any] | None, marker: Mapping[str, Any] | None, mine: Mapping[str, Any], *,
          adopt: bool, what: str) -> str:
    """'create', 'update' or 'adopt' for an existing/non-existing row; raises NameConflict otherwise."""
    if row is None:
        return "create"
    if row.get("managed_by") == MANAGED_BY and (marker is None or same_owner(marker, mine)):
        return "update"
    if row.get("managed_by") != MANAGED_BY:
        if adopt:
            return "adopt"
        raise InvalidSpec(NAME_CONFLICT, f"{what} already exists and is managed by kdbl-control; delete it, "
                                         f"rename this resource, or annotate it {ANNOTATION_ADOPT}=true to take it over")
    owner = "/".join(str(marker.get(k)) for k in ("namespace", "name") if marker and marker.get(k))
    raise InvalidSpec(NAME_CONFLICT, f"{what} is already managed by {mine.get('kind')} {owner}")


def changes(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """Columns whose current value differs from the desired one."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def grant_changes(current: Iterable[str], desired: Iterable[str]) -> tuple[list[str], list[str]]:
    """(subjects to add, subjects to remove) for whole-source grants."""
    cur, want = set(current), set(desired)
    return sorted(want - cur), sorted(cur - want)


def namespace_allowed(tenant_settings: Mapping[str, Any], namespace: str) -> bool:
    op = tenant_settings.get("operator") or {}
    allowed = {op.get("namespace"), *(op.get("source_namespaces") or [])}
    return "*" in allowed or namespace in allowed


# ------------------------------------------------------------------------------------------------
# Bootstrap token
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenPlan:
    action: str  # 'keep' | 'mint'
    why: str = ""  # 'missing' | 'unknown' | 'rotation'
    keep_lookup_id: str | None = None
    revoke: tuple[str, ...] = ()


def plan_bootstrap(*, secret_lookup_id: str | None, secret_has_token: bool, active_lookup_ids: Sequence[str],
                   rotate_to: str | None, rotated: str | None) -> TokenPlan:
    """Decide whether the tenant's bootstrap Secret still holds a live token.

    secret_lookup_id: the lookup id the Secret records (None: no Secret);
    active_lookup_ids: unrevoked operator bootstrap tokens of the tenant;
    rotate_to / rotated: the rotation annotation's value now / when last handled.
    """
    if rotate_to and rotate_to != (rotated or ""):
        return TokenPlan("mint", "rotation", revoke=tuple(active_lookup_ids))
    if secret_lookup_id is None or not secret_has_token:
        return TokenPlan("mint", "missing", revoke=tuple(active_lookup_ids))
    if secret_lookup_id not in active_lookup_ids:
        return TokenPlan("mint", "unknown", revoke=tuple(active_lookup_ids))
    stale = tuple(x for x in active_lookup_ids if x != secret_lookup_id)
    return TokenPlan("keep", keep_lookup_id=secret_lookup_id, revoke=stale)


# ------------------------------------------------------------------------------------------------
# Status: conditions and the minimal patch
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    """What a reconcile ended with, for the conditions."""

    degraded: InvalidSpec | None = None
    deleting: bool = False
    message: str = ""


def conditions(previous: Sequence[Mapping[str, Any]] | None, outcome: Outcome, *, generation: int | None,
               now: datetime) -> list[dict[str, Any]]:
    """Ready / Reconciling / Degraded, keeping lastTransitionTime where a status did not change."""
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    old = {c.get("type"): c for c in previous or []}
    bad = outcome.degraded
    wanted = [
        ("Ready", "False" if bad or outcome.deleting else "True",
         bad.reason if bad else ("Deleting" if outcome.deleting else "Reconciled"),
         bad.message if bad else (outcome.message or "the database matches the spec")),
        ("Reconciling", "True" if outcome.deleting or (bad and bad.temporary) else "False",
         "Deleting" if outcome.deleting else ("Retrying" if bad and bad.temporary else "Idle"),
         outcome.message if outcome.deleting else ("will retry with backoff" if bad and bad.temporary else "")),
        ("Degraded", "True" if bad else "False", bad.reason if bad else "AsExpected",
         bad.message if bad else ""),
    ]
    out: list[dict[str, Any]] = []
    for ctype, cstatus, reason, message in wanted:
        prev = old.get(ctype) or {}
        cond: dict[str, Any] = {
            "type": ctype, "status": cstatus, "reason": reason, "message": message,
            "lastTransitionTime": prev.get("lastTransitionTime", stamp) if prev.get("status") == cstatus else stamp,
        }
        if generation is not None:
            cond["observedGeneration"] = generation
        out.append(cond)
    return out


def phase(outcome: Outcome) -> str:
    if outcome.deleting:
        return "Deleting"
    return "Degraded" if outcome.degraded else "Ready"


def status_patch(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """Only the top-level status keys that differ (None removes a key): a resync that changes nothing
    writes nothing, so watchers are not woken every interval."""
    current = current or {}
    return {k: v for k, v in desired.items() if current.get(k) != v}


def transition(previous: Sequence[Mapping[str, Any]] | None, outcome: Outcome) -> tuple[str, str, str] | None:
    """The Event to post for this outcome, or None when nothing changed since the last one."""
    old = {c.get("type"): c for c in previous or []}
    was = old.get("Degraded") or {}
    if outcome.degraded:
        if was.get("status") == "True" and was.get("reason") == outcome.degraded.reason \
                and was.get("message") == outcome.degraded.message:
            return None
        return ("Warning", outcome.degraded.reason, outcome.degraded.message)
    if (old.get("Ready") or {}).get("status") == "True":
        return None
    return ("Normal", "Reconciled", outcome.message or "the database matches the spec")


def embedding_progress(embedded: int, total: int) -> int:
    """Percent of chunks with an embedding (100 for an empty source)."""
    if total <= 0:
        return 100
    return min(100, (embedded * 100) // total)
