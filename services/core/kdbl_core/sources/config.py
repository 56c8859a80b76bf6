"""The one source-config schema (`sources.config`): fields, defaults and validation per protocol.

Three paths wrote or read this JSON before, each with its own rules: kdbl-control's `source add`, the
operator (a Source's spec -> row) and each connector's `parse_config`. Now `build` turns an intent
(the stored field names, None = unset) into the canonical stored dict and `parse` turns a stored dict
into a typed, validated record with the defaults applied; the CLI and the operator call `build`, the
worker's connectors call `parse`. Errors are InvalidArgument naming the stored field (JSON-RPC -32602);
the operator renames the field to its spec path, the CLI to its option.

Stored fields (unchanged, so existing rows and Source resources keep working):

  every protocol  credentials   a *reference*, never a value: {"env": {NAME: ENV_VAR}}, {"dir": PATH}
                                (a mounted Secret, one file per name); s3 also {"anonymous": true}
                  verify_tls    default true; ca_file: a CA bundle (s3, webdav, http)
                  include / exclude  glob lists (kdbl_core.sources.globs; empty = everything / nothing)
                  ocr           default true; false leaves images and scanned pages unread
                  entities      default false; true: named entities are extracted from its chunks (issue 31)
                  labels        a list of labels every file of the source gets (search filter `labels`)
                  label_globs   {"glob": ["label", ...]}: more labels for the keys a glob matches (the
                                include/exclude glob rules); a file's labels are the union, deduplicated
                  max_file_bytes  per-source cap (default KDBL_MAX_FILE_BYTES)
                  honor_file_permissions, credentials_secret, k8s   the operator's bookkeeping
  fs      root (an absolute folder inside the worker; no credentials), follow_symlinks (default false:
          no symbolic link is followed; true: those that stay inside root are; a link that leaves the root
          is never followed; kdbl_worker.connectors.fs)
  s3      bucket, prefix (a folder), endpoint_url (no user:password), region (us-east-1), path_style
          (true when endpoint_url is set), max_attempts 5, base_delay, page_size 1000, connect_timeout 10,
          read_timeout 60, spool_max_bytes 32 MiB, object_tags false (true: object tags become labels)
  smb     server, share, path (a folder in the share), port 445, domain, max_attempts 4, base_delay 0.5,
          max_depth 64, connect_timeout 10, permission_checks ("every-crawl", the default: each file's
          security descriptor is read at every crawl of a from-source source; "changed": only for files
          whose change time moved since it was last read, and all of them once permission_full_check_hours,
          default 24, have passed since the last full check; for Windows servers, whose change time moves
          with the ACL; Samba's does not: kdbl_worker.connectors.smb)
  webdav / http   url (http[s], no user:password, query or fragment), max_attempts 4, base_delay 0.5,
          max_depth 64, connect_timeout 10, read_timeout 60, spool_max_bytes 32 MiB

Unknown keys are kept as they are (a row may carry keys a newer or older version wrote). `build` is
stricter than `parse` in one place: an fs config with credentials is refused when written (the operator
always refused it) but a stored one (kdbl-control accepted it) still parses, its credentials unused.
An smb config without credentials is valid here (a Source without a Secret reference always was); the
SMB connector refuses to connect without one, as before.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import globs

__all__ = ["PROTOCOLS", "CREDENTIAL_NAMES", "SourceConfig", "FsConfig", "S3Config", "SmbConfig", "HttpConfig",
           "build", "parse"]

PROTOCOLS = ("fs", "s3", "smb", "webdav", "http")
# Names a credentials reference may carry, per protocol (required ones first; the operator checks a
# Secret's keys against the required ones).
CREDENTIAL_NAMES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fs": ((), ()),
    "s3": (("access_key_id", "secret_access_key"), ("session_token",)),
    "smb": (("username", "password"), ("domain",)),
    "webdav": (("username", "password"), ()),
    "http": (("username", "password"), ()),
}
SPOOL_MAX_BYTES = 32 * 1024 * 1024
_CONNECTION: dict[str, tuple[str, ...]] = {
    "fs": ("root",),
    "s3": ("bucket", "prefix", "endpoint_url", "region", "path_style"),
    "smb": ("server", "share", "path", "port", "domain"),
    "webdav": ("url",),
    "http": ("url",),
}
# Stored only when they differ from the default (the form both writers used).
_DEFAULT_OMITTED = {"verify_tls": True, "ocr": True, "honor_file_permissions": False, "follow_symlinks": False,
                    "entities": False}


# ------------------------------------------------------------------------------------------------
# records
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True, kw_only=True)
class SourceConfig:
    """What every protocol's config has. `stored` is the dict as it is (or will be) in sources.config."""

    protocol: str
    stored: dict[str, Any]
    credentials: dict | None = None  # a reference (None: none, or s3's anonymous form)
    verify_tls: bool = True
    ca_file: str | None = None
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    ocr: bool = True
    max_file_bytes: int | None = None
    honor_file_permissions: bool = False
    entities: bool = False  # named entities extracted from its chunks (issue 31: kdbl_worker.entity_stage)
    labels: tuple[str, ...] = ()
    label_globs: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (glob, its labels), in the config's order

    @property
    def verify(self) -> bool | str:
        """TLS verification as httpx / botocore take it: False, True, or the CA bundle's path."""
        return (self.ca_file or True) if self.verify_tls else False


@dataclass(frozen=True, slots=True, kw_only=True)
class FsConfig(SourceConfig):
    root: str
    follow_symlinks: bool = False  # true: symbolic links that resolve inside root are followed


@dataclass(frozen=True, slots=True, kw_only=True)
class S3Config(SourceConfig):
    bucket: str
    prefix: str  # "" or a folder ending in "/"
    endpoint_url: str | None
    region: str
    path_style: bool | None
    anonymous: bool
    max_attempts: int
    base_delay: float | None
    page_size: int
    connect_timeout: float
    read_timeout: float
    spool_max_bytes: int
    object_tags: bool = False  # each changed object's tags become labels: one GetObjectTagging per object

    @property
    def where(self) -> str:
        """The endpoint for messages; never carries credentials."""
        return self.endpoint_url or f"AWS S3 ({self.region})"


@dataclass(frozen=True, slots=True, kw_only=True)
class SmbConfig(SourceConfig):
    server: str
    share: str
    path: tuple[str, ...]
    port: int
    domain: str | None
    max_attempts: int
    base_delay: float
    max_depth: int
    connect_timeout: float
    permission_checks: str = "every-crawl"  # or "changed" (the module's notes)
    permission_full_check_hours: float = 24.0

    @property
    def where(self) -> str:
        """The share for messages; never carries credentials."""
        return "/".join((f"smb source //{self.server}:{self.port}", self.share, *self.path))


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig(SourceConfig):
    origin: str  # scheme://host[:port]
    base_path: str  # decoded, ends with "/"
    max_attempts: int
    base_delay: float
    max_depth: int
    connect_timeout: float
    read_timeout: float
    spool_max_bytes: int

    @property
    def url(self) -> str:
        return self.origin + quote(self.base_path, safe="/")


# ------------------------------------------------------------------------------------------------
# field checks
# ------------------------------------------------------------------------------------------------
def _number(config: Mapping[str, Any], name: str, default: float | None, low: float, high: float, *,
            integer: bool = False) -> Any:
    value = config.get(name, default)
    if value is None:
        return None
    kind = int if integer else int | float
    if isinstance(value, bool) or not isinstance(value, kind) or not low <= value <= high:
        raise InvalidArgument(name, f"must be {'an integer' if integer else 'a number'} from {low} to {high}")
    return value


def _bool(config: Mapping[str, Any], name: str, default: bool) -> bool:
    value = config.get(name, default)
    if not isinstance(value, bool):
        raise InvalidArgument(name, "must be true or false")
    return value


def _text(config: Mapping[str, Any], name: str, what: str = "must be a string") -> str | None:
    value = config.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidArgument(name, what)
    return value


def _globs(config: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = config.get(name)
    if value is None:
        return ()
    if isinstance(value, str) and value:  # one pattern: kdbl_core.sources.globs always read it so
        return (value,)
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise InvalidArgument(name, "must be a list of non-empty glob patterns")
    return tuple(value)


MAX_LABEL_CHARS = 200


def label_list(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if (not isinstance(value, list)
            or not all(isinstance(v, str) and v.strip() and len(v) <= MAX_LABEL_CHARS for v in value)):
        raise InvalidArgument(name, f"must be a list of non-empty labels of at most {MAX_LABEL_CHARS} characters")
    return tuple(dict.fromkeys(v.strip() for v in value))


def label_globs(config: Mapping[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    value = config.get("label_globs")
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(g, str) and g for g in value):
        raise InvalidArgument("label_globs", 'must be an object {"glob": ["label", ...]}')
    for glob in value:  # refused when written, not at the first crawl
        try:
            globs.Selection.of([glob])
        except InvalidArgument as exc:
            raise InvalidArgument("label_globs", f"{glob!r}: {str(exc).split(': ', 1)[-1]}") from None
    return tuple((glob, label_list(labels, "label_globs")) for glob, labels in value.items())


def _credentials(protocol: str, ref: Any) -> tuple[dict | None, bool]:
    """(reference, anonymous). Only the shape is checked here: names and files are read by the worker
    (kdbl_worker.connectors.read_credentials), and an error never echoes a value."""
    if ref is None or protocol == "fs":  # fs: refused by build; a row kdbl-control once stored keeps working
        return None, False
    if protocol == "s3" and isinstance(ref, dict) and ref.get("anonymous") is True and len(ref) == 1:
        return None, True
    if not isinstance(ref, dict) or len(ref) != 1 or not ({"env", "dir"} & ref.keys()):
        forms = '{"env": {...}}, {"dir": PATH}' + (' or {"anonymous": true}' if protocol == "s3" else "")
        raise InvalidArgument("credentials",
                              f"must be {forms}; secret values are never stored in a source config")
    return dict(ref), False


def _http_url(value: Any, name: str, what: str) -> Any:
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument(name, what)
    if parts.username or parts.password:
        raise InvalidArgument(name, "must not carry credentials; use a credentials reference")
    return parts


def _folders(value: str) -> list[str]:
    return [p for p in value.replace("\\", "/").split("/") if p]


def _common(protocol: str, config: Mapping[str, Any]) -> dict[str, Any]:
    credentials, anonymous = _credentials(protocol, config.get("credentials"))
    max_bytes = config.get("max_file_bytes")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):
        raise InvalidArgument("max_file_bytes", "must be an integer >= 1")
    for name in ("credentials_secret", "k8s"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise InvalidArgument(name, "must be an object")
    common = {
        "protocol": protocol, "stored": dict(config), "credentials": credentials,
        "verify_tls": _bool(config, "verify_tls", True),
        "ca_file": _text(config, "ca_file", "must be a path"),
        "include": _globs(config, "include"), "exclude": _globs(config, "exclude"),
        "ocr": _bool(config, "ocr", True), "max_file_bytes": max_bytes,
        "honor_file_permissions": _bool(config, "honor_file_permissions", False),
        "entities": _bool(config, "entities", False),
        "labels": label_list(config.get("labels"), "labels"), "label_globs": label_globs(config),
    }
    if protocol == "s3":
        common["anonymous"] = anonymous
    return common


# ------------------------------------------------------------------------------------------------
# per protocol
# ------------------------------------------------------------------------------------------------
def _fs(config: Mapping[str, Any], common: dict[str, Any]) -> FsConfig:
    root = config.get("root")
    if not isinstance(root, str) or not root:
        raise InvalidArgument("root", "a folder is required")
    if not os.path.isabs(root):
        raise InvalidArgument("root", "must be an absolute path inside the worker")
    return FsConfig(root=root, follow_symlinks=_bool(config, "follow_symlinks", False), **common)


def _s3(config: Mapping[str, Any], common: dict[str, Any]) -> S3Config:
    bucket = config.get("bucket")
    if not isinstance(bucket, str) or not bucket.strip() or "/" in bucket:
        raise InvalidArgument("bucket", "a bucket name is required")
    prefix = _text(config, "prefix") or ""
    prefix = prefix.lstrip("/")
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    endpoint = config.get("endpoint_url") or None
    if endpoint is not None:
        _http_url(endpoint, "endpoint_url", "must be an http:// or https:// URL")
    region = _text(config, "region") or "us-east-1"
    path_style = config.get("path_style")
    if path_style is not None and not isinstance(path_style, bool):
        raise InvalidArgument("path_style", "must be true or false")
    if path_style is None and endpoint is not None:
        path_style = True  # what MinIO and RGW expect
    return S3Config(
        bucket=bucket.strip(), prefix=prefix, endpoint_url=endpoint, region=region, path_style=path_style,
        max_attempts=_number(config, "max_attempts", 5, 1, 20, integer=True),
        base_delay=_seconds(config, "base_delay", None, 0.0, 60.0),
        page_size=_number(config, "page_size", 1000, 1, 1000, integer=True),
        connect_timeout=_seconds(config, "connect_timeout", 10.0, 0.1, 600.0) or 10.0,
        read_timeout=_seconds(config, "read_timeout", 60.0, 0.1, 3600.0) or 60.0,
        spool_max_bytes=_number(config, "spool_max_bytes", SPOOL_MAX_BYTES, 0, 1 << 30, integer=True),
        object_tags=_bool(config, "object_tags", False), **common)


def _seconds(config: Mapping[str, Any], name: str, default: float | None, low: float,
             high: float) -> float | None:
    value = config.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise InvalidArgument(name, f"must be a number of seconds from {low} to {high}")
    return float(value)


def _smb(config: Mapping[str, Any], common: dict[str, Any]) -> SmbConfig:
    server = config.get("server")
    if not isinstance(server, str) or not server.strip() or any(c in server for c in "/\\@ "):
        raise InvalidArgument("server", "a host name or address is required (no slashes, no user@)")
    share = config.get("share")
    if not isinstance(share, str) or not share.strip("/\\") or any(c in share.strip("/\\") for c in "/\\"):
        raise InvalidArgument("share", "a share name is required (one name, no slashes)")
    path = config.get("path") or ""
    if not isinstance(path, str) or any(p in (".", "..") for p in _folders(path)):
        raise InvalidArgument("path", "must be a folder inside the share, without '.' or '..'")
    domain = config.get("domain")
    if domain is not None and (not isinstance(domain, str) or "\\" in domain):
        raise InvalidArgument("domain", "must be a domain name")
    return SmbConfig(
        server=server.strip(), share=share.strip("/\\"), path=tuple(_folders(path)),
        port=_number(config, "port", 445, 1, 65535, integer=True), domain=domain or None,
        max_attempts=_number(config, "max_attempts", 4, 1, 20, integer=True),
        base_delay=float(_number(config, "base_delay", 0.5, 0.0, 60.0)),
        max_depth=_number(config, "max_depth", 64, 1, 1000, integer=True),
        connect_timeout=float(_number(config, "connect_timeout", 10.0, 0.1, 600.0)),
        permission_checks=_permission_checks(config.get("permission_checks")),
        permission_full_check_hours=float(_number(config, "permission_full_check_hours", 24.0, 0.0, 24.0 * 366)),
        **common)


PERMISSION_CHECKS = ("every-crawl", "changed")


def _permission_checks(value: Any) -> str:
    if value is None:
        return "every-crawl"
    if value not in PERMISSION_CHECKS:
        raise InvalidArgument("permission_checks", "must be every-crawl or changed")
    return value


def _http(config: Mapping[str, Any], common: dict[str, Any]) -> HttpConfig:
    parts = _http_url(config.get("url"), "url", "an http:// or https:// URL is required")
    if parts.query or parts.fragment:
        raise InvalidArgument("url", "must not have a query or a fragment")
    try:
        base_path = unquote(parts.path or "/", errors="strict")
    except UnicodeDecodeError:
        raise InvalidArgument("url", "its path must be percent-encoded UTF-8") from None
    if not base_path.endswith("/"):
        base_path += "/"
    return HttpConfig(
        origin=f"{parts.scheme}://{parts.netloc}", base_path=base_path,
        max_attempts=_number(config, "max_attempts", 4, 1, 20, integer=True),
        base_delay=float(_number(config, "base_delay", 0.5, 0.0, 60.0)),
        max_depth=_number(config, "max_depth", 64, 1, 1000, integer=True),
        connect_timeout=float(_number(config, "connect_timeout", 10.0, 0.1, 600.0)),
        read_timeout=float(_number(config, "read_timeout", 60.0, 0.1, 3600.0)),
        spool_max_bytes=_number(config, "spool_max_bytes", SPOOL_MAX_BYTES, 0, 1 << 30, integer=True),
        **common)


_PARSERS = {"fs": _fs, "s3": _s3, "smb": _smb, "webdav": _http, "http": _http}


def parse(protocol: str, config: Any) -> SourceConfig:
    """A stored (or about to be stored) config -> its typed record; InvalidArgument names the field.
    Reads no secret."""
    if protocol not in _PARSERS:
        raise InvalidArgument("protocol", f"'{protocol}' is not one of {', '.join(PROTOCOLS)}")
    if not isinstance(config, dict):
        raise InvalidArgument("config", "must be an object")
    return _PARSERS[protocol](config, _common(protocol, config))


def build(protocol: str, **fields: Any) -> SourceConfig:
    """An intent (stored field names; None, "" and [] mean unset) -> the validated record whose
    `stored` is the canonical dict: unset fields and defaults (verify_tls, ocr true; honor_file_permissions
    false) are left out, glob lists keep their first occurrence of each pattern."""
    if protocol == "fs" and fields.get("credentials") is not None:
        raise InvalidArgument("credentials",
                              "protocol fs takes no credentials (mount the folder into the worker)")
    if protocol != "fs" and fields.get("follow_symlinks"):
        raise InvalidArgument("follow_symlinks", f"is a setting of protocol fs only, not {protocol}")
    for smb_only in ("permission_checks", "permission_full_check_hours"):
        if protocol != "smb" and fields.get(smb_only) is not None:
            raise InvalidArgument(smb_only, f"is a setting of protocol smb only, not {protocol}")
    if protocol in _CONNECTION:
        foreign = [k for k in fields if k in _ALL_CONNECTION and k not in _CONNECTION[protocol]
                   and fields[k] not in (None, "", [])]
        if foreign:
            raise InvalidArgument(foreign[0], f"is not a setting of protocol {protocol}")
    stored: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None or value == "" or value == [] or _DEFAULT_OMITTED.get(key, object()) is value:
            continue
        if key in ("include", "exclude") and isinstance(value, list | tuple):
            value = list(dict.fromkeys(value))
        stored[key] = value
    return parse(protocol, stored)


_ALL_CONNECTION = frozenset(k for keys in _CONNECTION.values() for k in keys)
