"""Leader election over a coordination.k8s.io/v1 Lease, so that two `kdbl-operator` replicas never
reconcile at the same time.

The same protocol as client-go's leaderelection: the holder renews `spec.renewTime` every
`renew_seconds`; a candidate takes the Lease over only once `renewTime + leaseDurationSeconds` has
passed; every write carries the `resourceVersion` it read (a precondition of the merge patch), so of two
racing candidates the API server accepts one (409 for the other). A leader that cannot renew within the renew deadline
(2/3 of the lease) stops working before anyone else may start. `decide` is pure and unit-tested.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kdbl_core.errors import TemporaryError

from kdbl_operator import k8s

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseView:
    holder: str | None
    renew_time: datetime | None
    duration: float
    transitions: int
    acquire_time: str | None
    resource_version: str | None


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse(raw: Mapping[str, Any]) -> LeaseView:
    spec = raw.get("spec") or {}
    return LeaseView(holder=spec.get("holderIdentity") or None, renew_time=_parse_time(spec.get("renewTime")),
                     duration=float(spec.get("leaseDurationSeconds") or 0), transitions=int(spec.get("leaseTransitions") or 0),
                     acquire_time=spec.get("acquireTime"),
                     resource_version=(raw.get("metadata") or {}).get("resourceVersion"))


def decide(view: LeaseView | None, me: str, now: datetime) -> str:
    """'create' (no Lease yet), 'renew' (mine), 'takeover' (free or expired), or 'wait' (someone else's)."""
    if view is None:
        return "create"
    if view.holder == me:
        return "renew"
    if not view.holder or view.renew_time is None:
        return "takeover"
    if view.renew_time + timedelta(seconds=view.duration) < now:
        return "takeover"
    return "wait"


def micro_time(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    def __init__(self, *, namespace: str, name: str, identity: str, lease_seconds: float,
                 renew_seconds: float) -> None:
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds, self.renew_seconds = lease_seconds, renew_seconds
        self.renew_deadline = lease_seconds * 2 / 3
        self.is_leader = False
        self._last_renew: datetime | None = None

    def _body(self, view: LeaseView | None, now: datetime, *, holder: str | None, duration: float) -> dict[str, Any]:
        keep = view is not None and view.holder == holder and holder is not None
        spec: dict[str, Any] = {
            "holderIdentity": holder, "leaseDurationSeconds": max(1, round(duration)),
            "renewTime": micro_time(now),
            "acquireTime": view.acquire_time if keep and view and view.acquire_time else micro_time(now),
            "leaseTransitions": (view.transitions if view else 0) + (0 if keep or view is None or holder is None else 1),
        }
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if view is not None and view.resource_version:
            meta["resourceVersion"] = view.resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        raw = await k8s.read_lease(self.namespace, self.name)
        view = parse(raw) if raw is not None else None
        action = decide(view, self.identity, now)
        if action == "wait":
            return False
        body = self._body(view, now, holder=self.identity, duration=self.lease_seconds)
        try:
            await k8s.write_lease(self.namespace, body, create=action == "create")
        except k8s.Conflict:
            return False
        if action != "renew":
            log.info("acquired leadership", extra={"lease": f"{self.namespace}/{self.name}", "identity": self.identity})
        self._last_renew = now
        return True

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica leads (True) or `stop` is set (False)."""
        while not stop.is_set():
            try:
                if await self.try_acquire_or_renew():
                    self.is_leader = True
                    return True
            except TemporaryError as exc:
                log.warning("leader election: %s", exc.message)
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.renew_seconds)
            except TimeoutError:
                pass
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        """Renew until `stop` is set; return early when leadership is lost (the caller must stop working)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.renew_seconds)
                return
            except TimeoutError:
                pass
            try:
                if not await self.try_acquire_or_renew():
                    log.error("leadership lost: another replica holds the lease")
                    self.is_leader = False
                    return
            except TemporaryError as exc:
                log.warning("lease renewal failed: %s", exc.message)
            if self._last_renew is not None and \
                    (datetime.now(UTC) - self._last_renew).total_seconds() > self.renew_deadline:
                log.error("leadership lost: could not renew the lease within %.1f s", self.renew_deadline)
                self.is_leader = False
                return

    async def release(self) -> None:
        """Give the Lease up at shutdown so another replica can lead at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            raw = await k8s.read_lease(self.namespace, self.name)
            view = parse(raw) if raw is not None else None
            if view is None or view.holder != self.identity:
                return
            body = self._body(view, datetime.now(UTC), holder=None, duration=1)
            await k8s.write_lease(self.namespace, body, create=False)
        except (TemporaryError, k8s.Conflict) as exc:
            log.warning("could not release the lease: %s", exc)
