"""The only module that talks to the Kubernetes API (besides kopf's own watching and patching).

- Connection: in-cluster service account, or a kubeconfig (`Settings.operator.kubeconfig`: KUBECONFIG or
  --kubeconfig); the same credentials are handed to kopf through its login hook.
- Secrets: the operator reads only *metadata and key names* of a Secret (never returns values to the
  caller) and writes the bootstrap-token Secret of a tenant.
- Events: posted through kopf's event queue.
- Leases (coordination.k8s.io/v1): the leader election of `kdbl-operator` replicas.

The official client is synchronous; every call runs in a worker thread. API failures become
`KubernetesUnavailable` (retry later) except 404/409, which callers handle.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf
import kubernetes
from kdbl_core.errors import ConfigError, Conflict, NotFound, TemporaryError
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"

_client: kubernetes.client.ApiClient | None = None
_config: kubernetes.client.Configuration | None = None
_kubeconfig: str | None = None  # what configure() was given: the login hook and a reconnect after close() use it
_configured = False


class KubernetesUnavailable(TemporaryError):
    """The API server refused or failed a request; worth retrying."""


class NamespaceMissing(NotFound):
    """A namespaced write found no such namespace."""

    def __init__(self, namespace: str) -> None:
        super().__init__(f"namespace '{namespace}' does not exist")
        self.namespace = namespace


# A 409 on a Lease (it changed or appeared underneath us) raises kdbl_core.errors.Conflict (k8s.Conflict).


def _load(kubeconfig: str | None) -> tuple[kubernetes.client.Configuration, str]:
    cfg = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=cfg)
        return cfg, "in-cluster service account"
    except kubernetes.config.ConfigException:
        pass
    path = kubeconfig or os.path.expanduser("~/.kube/config")
    try:
        kubernetes.config.load_kube_config(config_file=path, client_configuration=cfg)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise ConfigError(f"no Kubernetes credentials: not in a cluster, and kubeconfig {path}: {exc}") from None
    return cfg, f"kubeconfig {path}"


def configure(kubeconfig: str | None) -> kubernetes.client.Configuration:
    """Load credentials: in-cluster first, then the kubeconfig named here (settings.operator.kubeconfig),
    else ~/.kube/config."""
    global _client, _config, _kubeconfig, _configured
    cfg, source = _load(kubeconfig)
    _kubeconfig, _configured = kubeconfig, True
    _config, _client = cfg, kubernetes.client.ApiClient(cfg)
    log.info("kubernetes API configured", extra={"server": cfg.host, "credentials": source})
    return cfg


def use(kubeconfig: str | None) -> None:
    """Configure from this kubeconfig unless that is what the client already uses."""
    if _client is None or _kubeconfig != kubeconfig:
        configure(kubeconfig)


def _api() -> kubernetes.client.ApiClient:
    """The client; after close(), a fresh one from the kubeconfig configure() was given. Every entry point
    configures first (kdbl-operator's main, the handlers' startup) with its settings' kubeconfig."""
    if _client is None:
        if not _configured:
            raise ConfigError("the Kubernetes client is not configured: call k8s.configure(kubeconfig) with "
                              "the settings' operator.kubeconfig first")
        configure(_kubeconfig)
    assert _client is not None
    return _client


def close() -> None:
    global _client, _config
    if _client is not None:
        _client.close()
    _client = _config = None


def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's login hook (called again on 401): freshly loaded credentials, so a rotated service-account
    token is picked up. Mirrors kopf.login_via_client, but honours --kubeconfig / $KUBECONFIG."""
    cfg, _source = _load(_kubeconfig)
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = ((None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1]))
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl, username=cfg.username or None,
        password=cfg.password or None, scheme=scheme, token=token, certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file)


def _unavailable(what: str, exc: BaseException) -> KubernetesUnavailable:
    if isinstance(exc, ApiException):
        return KubernetesUnavailable(f"{what}: HTTP {exc.status} {exc.reason or ''}".strip())
    return KubernetesUnavailable(f"{what}: {type(exc).__name__}")


def _json(response: Any) -> dict[str, Any]:
    return json.loads(response.data or b"{}")


# ------------------------------------------------------------------------------------------------
# Secrets
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecretInfo:
    """What the operator may know about a Secret: metadata and the names of its keys, never values."""

    namespace: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    keys: frozenset[str]

    @property
    def managed_by_operator(self) -> bool:
        return self.labels.get("app.kubernetes.io/managed-by") == "kdbl-operator"


def _read_secret(namespace: str, name: str) -> SecretInfo | None:
    core = kubernetes.client.CoreV1Api(_api())
    try:
        raw = _json(core.read_namespaced_secret(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _unavailable(f"reading Secret {namespace}/{name}", exc) from None
    except Exception as exc:  # noqa: BLE001 - connection errors of urllib3
        raise _unavailable(f"reading Secret {namespace}/{name}", exc) from None
    meta = raw.get("metadata") or {}
    keys = set((raw.get("data") or {}).keys()) | set((raw.get("stringData") or {}).keys())
    del raw  # the values go out of scope here
    return SecretInfo(namespace, name, dict(meta.get("labels") or {}), dict(meta.get("annotations") or {}),
                      frozenset(keys))


async def read_secret(namespace: str, name: str) -> SecretInfo | None:
    return await asyncio.to_thread(_read_secret, namespace, name)


def secret_body(*, namespace: str, name: str, data: Mapping[str, str], labels: Mapping[str, str],
                annotations: Mapping[str, str], owner: Mapping[str, Any] | None) -> dict[str, Any]:
    """An Opaque Secret; `owner` (the Tenant's body) makes Kubernetes garbage-collect it with the Tenant."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels),
                            "annotations": dict(annotations)}
    owner_meta = (owner or {}).get("metadata") or {}
    if owner and owner_meta.get("uid"):
        meta["ownerReferences"] = [{
            "apiVersion": owner.get("apiVersion", "kdbl.io/v1alpha1"), "kind": owner.get("kind", "Tenant"),
            "name": owner_meta.get("name"), "uid": owner_meta["uid"], "controller": True,
            "blockOwnerDeletion": False,
        }]
    encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": meta, "data": encoded}


def _write_secret(body: dict[str, Any]) -> None:
    core = kubernetes.client.CoreV1Api(_api())
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        core.create_namespaced_secret(namespace, body, _preload_content=False)
        return
    except ApiException as exc:
        if exc.status == 404:
            raise NamespaceMissing(namespace) from None
        if exc.status != 409:
            raise _unavailable(f"creating Secret {namespace}/{name}", exc) from None
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(f"creating Secret {namespace}/{name}", exc) from None
    try:  # it exists already (the caller checked it is ours): overwrite its data, labels and annotations
        core.patch_namespaced_secret(name, namespace, body, _preload_content=False, _content_type=MERGE_PATCH)
    except ApiException as exc:
        raise _unavailable(f"updating Secret {namespace}/{name}", exc) from None
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(f"replacing Secret {namespace}/{name}", exc) from None


async def write_secret(body: dict[str, Any]) -> None:
    """Create the Secret, or replace it when it exists. Raises NamespaceMissing."""
    await asyncio.to_thread(_write_secret, body)


# ------------------------------------------------------------------------------------------------
# Events
# ------------------------------------------------------------------------------------------------
def event(body: Mapping[str, Any], *, type: str, reason: str, message: str) -> None:
    """Queue a Kubernetes Event about a custom resource (posted in the background by kopf)."""
    kopf.event(dict(body), type=type, reason=reason, message=message[:1024])


# ------------------------------------------------------------------------------------------------
# Leases (leader election)
# ------------------------------------------------------------------------------------------------
def _read_lease(namespace: str, name: str) -> dict[str, Any] | None:
    api = kubernetes.client.CoordinationV1Api(_api())
    try:
        return _json(api.read_namespaced_lease(name, namespace, _preload_content=False))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _unavailable(f"reading Lease {namespace}/{name}", exc) from None
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(f"reading Lease {namespace}/{name}", exc) from None


def _write_lease(namespace: str, body: dict[str, Any], *, create: bool) -> None:
    api = kubernetes.client.CoordinationV1Api(_api())
    name = body["metadata"]["name"]
    try:
        if create:
            api.create_namespaced_lease(namespace, body, _preload_content=False)
        else:  # metadata.resourceVersion in the patch is a precondition: 409 if someone wrote in between
            api.patch_namespaced_lease(name, namespace, body, _preload_content=False, _content_type=MERGE_PATCH)
    except ApiException as exc:
        if exc.status == 409:
            raise Conflict(f"Lease {namespace}/{name} was written by another holder meanwhile") from None
        raise _unavailable(f"writing Lease {namespace}/{name}", exc) from None
    except Exception as exc:  # noqa: BLE001
        raise _unavailable(f"writing Lease {namespace}/{name}", exc) from None


async def read_lease(namespace: str, name: str) -> dict[str, Any] | None:
    return await asyncio.to_thread(_read_lease, namespace, name)


async def write_lease(namespace: str, body: dict[str, Any], *, create: bool) -> None:
    """Create or update a Lease; raises Conflict when another writer won."""
    await asyncio.to_thread(_write_lease, namespace, body, create=create)
