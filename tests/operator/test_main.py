"""`kdbl-operator` itself: configuration errors, the health endpoint, and leader election between two
replicas (each a real `kdbl_operator.main.run` with kopf, against the emulated API via a kubeconfig)."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import threading
from typing import Any

import aiohttp
import kmock
import pytest
from kdbl_core.settings import Settings
from kdbl_operator import main
from operator_helpers import LEASES, free_port, tenant
from sqlalchemy import text


def test_the_operator_refuses_to_start_without_a_database_url(monkeypatch, capsys):
    monkeypatch.delenv("KDBL_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit) as exc:
        main.main(["--standalone"])
    assert exc.value.code == 2
    assert "KDBL_DATABASE_URL" in capsys.readouterr().err


def test_the_operator_refuses_to_start_without_kubernetes_credentials(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KDBL_DATABASE_URL", "postgresql://x@127.0.0.1:1/x")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SystemExit) as exc:
        main.main(["--kubeconfig", str(tmp_path / "missing")])
    assert exc.value.code == 2
    assert "no Kubernetes credentials" in capsys.readouterr().err


def test_kopf_run_registers_the_handlers_with_the_settings_of_the_environment(monkeypatch):
    """`kopf run -m kdbl_operator.kopf_run`: importing it (in a fresh process, as kopf's CLI does) registers
    every handler in kopf's default registry, the resync timers at KDBL_OPERATOR_RESYNC_SECONDS; importing
    kdbl_operator.handlers alone registers nothing and reads no settings."""
    monkeypatch.setenv("KDBL_OPERATOR_RESYNC_SECONDS", "7")
    probe = ("import kopf, sys\n"
             "import kdbl_operator.handlers\n"
             "registry = kopf.get_default_registry()\n"
             "assert not registry._spawning.get_all_handlers() and not registry._changing.get_all_handlers()\n"
             "import kdbl_operator.kopf_run\n"
             "print(sorted((h.id, h.interval) for h in registry._spawning.get_all_handlers()))\n"
             "print(sorted({h.id for h in registry._changing.get_all_handlers()}))\n"
             "print(sorted(h.id for h in registry._activities.get_all_handlers() if not h._fallback))\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "[('source_resync', 7.0), ('tenant_resync', 7.0)]",
        "['source_changed', 'source_deleted', 'tenant_changed', 'tenant_deleted']",
        "['cleanup', 'login', 'startup']",
    ]


class Replica:
    """One `kdbl-operator` process, as a thread with its own event loop."""

    def __init__(self, identity: str) -> None:
        self.port = free_port()
        self.cfg = Settings(operator={"health_host": "127.0.0.1", "health_port": self.port, "lease_seconds": 2,
                                      "lease_renew_seconds": 0.2})
        self.args = argparse.Namespace(standalone=False, peering=None, priority=0, identity=identity, kubeconfig=None)
        self.health = main.Health()
        self.result: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._target, daemon=True)

    def _target(self) -> None:
        async def go() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            self._started.set()
            self.result = await main.run(self.cfg, self.args, stop=self._stop, health=self.health)

        asyncio.run(go())

    async def start(self) -> Replica:
        self._thread.start()
        await asyncio.to_thread(self._started.wait, 10)
        return self

    async def stop(self) -> int | None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        await asyncio.to_thread(self._thread.join, 60)
        assert not self._thread.is_alive()
        return self.result

    async def healthz(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{self.port}/healthz") as resp:
            assert resp.status == 200
            return await resp.json()


async def test_two_replicas_elect_one_leader_and_hand_over_when_it_stops(cluster, owner_engine, names):
    def holder() -> str | None:
        key = (kmock.resource(LEASES), "kdbl", "kdbl-operator")
        objs = cluster.emulator.objects
        return objs[key].raw["spec"].get("holderIdentity") if key in objs and not objs[key].deleted else None

    def display_name(name: str) -> str | None:
        with owner_engine.connect() as conn:
            return conn.execute(text("SELECT display_name FROM tenants WHERE name = :n"), {"n": name}).scalar()

    a = await Replica("replica-a").start()
    await cluster.eventually(lambda: holder() == "replica-a", what="a leads")
    b = await Replica("replica-b").start()
    await cluster.eventually(lambda: b.health.role == "follower", what="b follows")
    assert (await a.healthz())["role"] == "leader" and (await b.healthz())["role"] == "follower"

    name = names("elected")
    await cluster.create(tenant(name))
    await cluster.ready("Tenant", name)
    assert holder() == "replica-a" and b.health.role == "follower"

    # The leader stops (a rollout): it releases the Lease and the follower takes over at once.
    assert await a.stop() == 0
    await cluster.eventually(lambda: holder() == "replica-b" and b.health.role == "leader", what="b leads")
    await cluster.patch("Tenant", name, {"spec": {"displayName": "Handed over"}})
    await cluster.eventually(lambda: display_name(name) == "Handed over", what="b reconciles")
    assert await b.stop() == 0
    assert holder() is None  # released on shutdown
