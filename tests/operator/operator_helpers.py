"""Helpers of the operator tests: a slightly more realistic kmock emulator, the test's view of the
emulated cluster, and builders for Tenant / Source / Secret bodies.

kmock's KubernetesEmulator stores objects but leaves out what the API server maintains itself. The
`Emulator` below adds the small part the operator relies on, as a real server does it:
metadata.uid / resourceVersion / generation / creationTimestamp, generateName, 422 when a JSON-patch
`test` of the resourceVersion fails (kopf's finalizer patches), 409 on a merge patch carrying a stale
metadata.resourceVersion (leader election), and 404 for namespaced creates in a namespace that does not exist.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import itertools
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import kmock
import yaml

NAMESPACES = {"default", "kdbl", "team-a", "team-b"}
TENANTS = "kdbl.io/v1alpha1/tenants"
SOURCES = "kdbl.io/v1alpha1/sources"
SECRETS = "v1/secrets"
EVENTS = "v1/events"
LEASES = "coordination.k8s.io/v1/leases"


class Emulator(kmock.KubernetesEmulator):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._versions = itertools.count(1)
        self.namespaces = set(NAMESPACES)

    async def _handle(self, request: Any) -> Any:
        data = request.data
        if request.resource is not None and data is not None:
            if request.action == kmock.action.CREATE and isinstance(data, dict):
                meta = data.setdefault("metadata", {})
                namespace = request.namespace or meta.get("namespace")
                if namespace is not None and namespace not in self.namespaces:
                    raise kmock.KubernetesError(status=404, reason="NotFound",
                                                message=f'namespaces "{namespace}" not found')
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta.setdefault("uid", str(uuid.uuid4()))
                meta["resourceVersion"] = str(next(self._versions))
                meta.setdefault("generation", 1)
                meta.setdefault("creationTimestamp",
                                datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            elif request.action == kmock.action.UPDATE and request.name is not None:
                key = (request.resource, request.namespace, request.name)
                obj = self.objects[key] if key in self.objects else None  # noqa: SIM401 - no .get() here
                current = obj.raw if obj is not None and not obj.deleted else None
                version = str(next(self._versions))
                if isinstance(data, list):  # JSON patch: kopf tests the resourceVersion first
                    if current is not None:
                        try:
                            jsonpatch.apply_patch(current, [op for op in data if op.get("op") == "test"])
                        except jsonpatch.JsonPatchException as exc:
                            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from None
                    data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
                elif isinstance(data, dict):
                    meta = data.setdefault("metadata", {})
                    sent = meta.get("resourceVersion")
                    if (request.method == kmock.method.PATCH and current is not None and sent
                            and sent != current.get("metadata", {}).get("resourceVersion")):
                        raise kmock.KubernetesError(status=409, reason="Conflict", message="the object has been modified")
                    meta["resourceVersion"] = version
                    if (current is not None and request.subresource is None and "spec" in data
                            and data["spec"] != current.get("spec")):
                        meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
        return await super()._handle(request)


def declare(emulator: Any) -> None:
    info = emulator.ResourceInfo
    verbs = {"get", "list", "watch", "create", "update", "patch", "delete"}
    emulator.resources[TENANTS] = info(kind="Tenant", singular="tenant", namespaced=False,
                                      subresources={"status"}, verbs=verbs)
    emulator.resources[SOURCES] = info(kind="Source", singular="source", namespaced=True,
                                      subresources={"status"}, verbs=verbs)
    emulator.resources[SECRETS] = info(kind="Secret", singular="secret", namespaced=True, verbs=verbs)
    emulator.resources[EVENTS] = info(kind="Event", singular="event", namespaced=True, verbs=verbs)
    emulator.resources[LEASES] = info(kind="Lease", singular="lease", namespaced=True, verbs=verbs)
    emulator.resources["v1/namespaces"] = info(kind="Namespace", singular="namespace", namespaced=False,
                                               verbs={"get", "list", "watch"})
    emulator.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = info(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False,
        verbs={"get", "list", "watch"})


class Cluster:
    """The test's view of the emulated API server: writes through HTTP (so watchers see them), reads
    from the emulator's memory, and waits on conditions with a bound."""

    def __init__(self, emulator: Any, session: aiohttp.ClientSession) -> None:
        self.emulator, self.session = emulator, session

    @staticmethod
    def _path(kind: str, namespace: str | None, name: str | None = None) -> str:
        if kind == "Tenant":
            base = "/apis/kdbl.io/v1alpha1/tenants"
        elif kind == "Source":
            base = f"/apis/kdbl.io/v1alpha1/namespaces/{namespace}/sources"
        elif kind == "Secret":
            base = f"/api/v1/namespaces/{namespace}/secrets"
        else:
            raise ValueError(kind)
        return f"{base}/{name}" if name else base

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        async with self.session.post(self._path(body["kind"], meta.get("namespace")), json=body) as resp:
            assert resp.status < 300, await resp.text()
            return await resp.json()

    async def patch(self, kind: str, name: str, patch: dict[str, Any], namespace: str | None = None) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self._path(kind, namespace, name), json=patch, headers=headers) as resp:
            assert resp.status < 300, await resp.text()

    async def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        async with self.session.delete(self._path(kind, namespace, name)) as resp:
            assert resp.status < 300, await resp.text()

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        resource = {"Tenant": TENANTS, "Source": SOURCES, "Secret": SECRETS}[kind]
        key = (kmock.resource(resource), namespace, name)
        if key not in self.emulator.objects or self.emulator.objects[key].deleted:
            return None
        return self.emulator.objects[key].raw

    def history(self, kind: str, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        resource = {"Tenant": TENANTS, "Source": SOURCES}[kind]
        key = (kmock.resource(resource), namespace, name)
        return [v.raw for v in self.emulator.objects[key].history if v is not None]

    def status(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return (self.get(kind, name, namespace) or {}).get("status") or {}

    def condition(self, kind: str, name: str, ctype: str, namespace: str | None = None) -> dict[str, Any]:
        for cond in self.status(kind, name, namespace).get("conditions") or []:
            if cond["type"] == ctype:
                return cond
        return {}

    def secret_token(self, namespace: str, name: str) -> str | None:
        secret = self.get("Secret", name, namespace)
        if not secret or "token" not in (secret.get("data") or {}):
            return None
        return base64.b64decode(secret["data"]["token"]).decode()

    def events(self, name: str, reason: str | None = None) -> list[dict[str, Any]]:
        out = []
        for (resource, _ns, _name), obj in list(self.emulator.objects.items()):
            if resource != kmock.resource(EVENTS) or obj.deleted:
                continue
            raw = obj.raw
            if raw.get("involvedObject", {}).get("name") == name and (reason is None or raw.get("reason") == reason):
                out.append(raw)
        return out

    async def eventually(self, check: Callable[[], Any], *, timeout: float = 20.0, what: str = "") -> Any:
        """Poll `check` (sync; may raise AssertionError) until it returns a truthy value."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while True:
            try:
                value = check()
                if value:
                    return value
            except AssertionError as exc:
                last = exc
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what or check}: {last}")
            await asyncio.sleep(0.05)

    async def handled(self, kind: str, name: str, namespace: str | None = None) -> None:
        """Wait until kopf's change handlers finished with the object's current spec (not only a timer)."""
        key = "kopf.kdbl.io/last-handled-configuration"
        await self.eventually(lambda: key in ((self.get(kind, name, namespace) or {}).get("metadata", {})
                                              .get("annotations") or {}), what=f"{kind} {name} handled")

    async def degraded(self, kind: str, name: str, reason: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.eventually(
            lambda: (c := self.condition(kind, name, "Degraded", namespace)).get("status") == "True"
            and c.get("reason") == reason and c, what=f"{kind} {name} Degraded/{reason}")

    async def ready(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return await self.eventually(
            lambda: self.condition(kind, name, "Ready", namespace).get("status") == "True"
            and self.status(kind, name, namespace), what=f"{kind} {name} Ready")


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "emulator", "cluster": {"server": server}}],
        "users": [{"name": "test", "user": {"token": "test-token"}}],
        "contexts": [{"name": "test", "context": {"cluster": "emulator", "user": "test"}}],
    }))
    return path


def tenant(name: str, /, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Tenant", "metadata": {"name": name},
            "spec": {"displayName": f"Tenant {name}", **spec}}


def source(name: str, tenant_name: str, namespace: str = "kdbl", /, **spec: Any) -> dict[str, Any]:
    body = {"tenantRef": {"name": tenant_name}, "protocol": "fs", "connection": {"path": f"/data/{name}"}}
    body.update(spec)
    return {"apiVersion": "kdbl.io/v1alpha1", "kind": "Source", "metadata": {"name": name, "namespace": namespace},
            "spec": body}


def secret(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque", "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}




def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
