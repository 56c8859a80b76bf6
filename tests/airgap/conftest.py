"""Fixtures for the airgap bundle tests (airgap/build_bundle.py, airgap/install_bundle.py).

The tools (skopeo, umoci, debootstrap, docker-registry, syft, helm) come from
.ci/install-airgap-tools.sh, run once per session; when it cannot install them the tests FAIL
(CI runs on fresh machines: a suite that skips for lack of tools proves nothing).

Tests marked ``slow_bundle`` build the full bundle with images (debootstrap + the portable
llama-cpp-python build on a cold cache); they run only with ``-m slow_bundle`` or KDBL_SLOW_BUNDLE=1.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AIRGAP = REPO / "airgap"
INSTALL_TOOLS = REPO / ".ci" / "install-airgap-tools.sh"
if str(AIRGAP) not in sys.path:
    sys.path.insert(0, str(AIRGAP))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow_bundle: builds the full airgap bundle with container images (minutes; "
        "run with -m slow_bundle or KDBL_SLOW_BUNDLE=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = os.environ.get("KDBL_SLOW_BUNDLE") == "1" or "slow_bundle" in (
        config.getoption("markexpr") or ""
    )
    if wanted:
        return
    skip = pytest.mark.skip(reason="slow_bundle: run with -m slow_bundle or KDBL_SLOW_BUNDLE=1")
    for item in items:
        if "slow_bundle" in item.keywords:
            item.add_marker(skip)


_tools_state: dict[str, object] = {}


@pytest.fixture(scope="session")
def airgap_tools() -> dict[str, str]:
    """Install (once) and locate every tool the bundle needs; fail loudly when that is impossible."""
    if "paths" not in _tools_state:
        proc = subprocess.run(["bash", str(INSTALL_TOOLS)], capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(f"{INSTALL_TOOLS} failed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        paths = {
            "skopeo": shutil.which("skopeo"),
            "umoci": shutil.which("umoci"),
            "debootstrap": shutil.which("debootstrap"),
            "docker-registry": shutil.which("docker-registry"),
            "helm": str(REPO / "tools" / "bin" / "helm"),
            "syft": str(Path(sys.executable).with_name("syft")),
        }
        missing = [k for k, v in paths.items() if not v or not Path(v).exists()]
        if missing:
            pytest.fail(f"after {INSTALL_TOOLS}: still missing {missing}")
        _tools_state["paths"] = paths
    return _tools_state["paths"]  # type: ignore[return-value]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(airgap_tools: dict[str, str]) -> Iterator[str]:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1:<free port>, plain HTTP, no auth."""
    work = Path(tempfile.mkdtemp(prefix="kdbl-registry-"))
    port = free_port()
    config = work / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log:\n  level: warn\n"
        f"storage:\n  filesystem:\n    rootdirectory: {work / 'data'}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n"
    )
    log = open(work / "registry.log", "w")
    proc = subprocess.Popen([airgap_tools["docker-registry"], "serve", str(config)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}/v2/"
    deadline = time.monotonic() + 120  # fails at once if the registry exits; the bound is for a loaded machine
    while True:
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.close()
            pytest.fail(f"docker-registry did not start on {url}:\n{(work / 'registry.log').read_text()}")
        time.sleep(0.2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
