"""Operator tests: the real kopf operator (kopf.testing.KopfRunner) against the kmock Kubernetes API
emulator (operator_helpers.Emulator) and the real embedded PostgreSQL (tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from operator_helpers import Cluster, Emulator, declare, write_kubeconfig

# The operator's knobs for every operator below (each reads the settings when it starts, as a process would).
# Only KDBL_OPERATOR_* knobs, which nothing outside the operator reads.
os.environ.update({
    "KDBL_OPERATOR_RESYNC_SECONDS": "1",
    "KDBL_OPERATOR_RETRY_BASE_SECONDS": "0.2",
    "KDBL_OPERATOR_RETRY_MAX_SECONDS": "1",
    "KDBL_OPERATOR_DELETE_BATCH": "2",
    "KDBL_OPERATOR_DELETE_BATCHES_PER_PASS": "1",
    "KDBL_OPERATOR_NAMESPACE": "kdbl",
})


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {"cls": Emulator}


@pytest.fixture
def kube_env(kmock: Any, tmp_path: Path, owner_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The emulator with the operator's resources declared; KUBECONFIG and KDBL_DATABASE_URL point at
    the emulator and the test database."""
    declare(kmock)
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", str(kmock.url).rstrip("/"))))
    monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return kmock


@pytest.fixture
async def cluster(kube_env: Any) -> Any:
    async with aiohttp.ClientSession(base_url=str(kube_env.url)) as session:
        yield Cluster(kube_env, session)


@pytest.fixture
async def operator(cluster: Cluster) -> Any:
    """The real operator (`kopf run --standalone -A` with the handlers kdbl_operator.kopf_run registers) in a
    background thread: each test's operator reads the settings afresh (its emulator's KUBECONFIG, the test
    database), as `kopf run -m kdbl_operator.kopf_run` does when its process starts, into a registry of its own."""
    import kopf
    from kdbl_core.settings import load_settings
    from kdbl_operator import handlers
    from kopf.testing import KopfRunner

    registry = handlers.register(load_settings(), kopf.OperatorRegistry())
    runner = KopfRunner(["run", "--standalone", "-A"], registry=registry, timeout=30)
    await asyncio.to_thread(runner.__enter__)
    try:
        yield cluster
    finally:
        await asyncio.to_thread(runner.__exit__, None, None, None)
    assert runner.exit_code == 0, runner.output[-4000:]


@pytest.fixture
def names(unique: str) -> Iterator[Callable[[str], str]]:
    yield lambda prefix: f"{prefix}-{unique}"
