"""`./dev test` and CI fail on a skipped test unless it is marked for an opt-in run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, strict: bool) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_needs_missing_data():\n    pytest.skip('data not found')\n"
        "@pytest.mark.slow_bundle\n"
        "def test_opted_in():\n    pytest.skip('run with -m slow_bundle')\n"
        "def test_plain():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "KDBL_FAIL_ON_SKIP": "1" if strict else "0"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "skip_policy",
                           "-W", "ignore::pytest.PytestUnknownMarkWarning", str(tmp_path / "test_sample.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_a_skip_without_an_opt_in_marker_fails_the_run(tmp_path):
    result = _run(tmp_path, strict=True)
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed, 1 skipped" in result.stdout
    assert "skipped without an opt-in marker" in result.stdout and "data not found" in result.stdout


def test_without_the_switch_a_skip_stays_a_skip(tmp_path):
    result = _run(tmp_path, strict=False)
    assert result.returncode == 0 and "1 passed, 2 skipped" in result.stdout, result.stdout
