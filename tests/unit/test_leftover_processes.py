"""The session-end check (tests/leftover_processes.py) fails a run whose tests leave a process behind, names
the test that started it, and kills it, orphaned grandchildren included; a run that reaps passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

CONFTEST = """
from leftover_processes import pytest_configure, pytest_runtest_setup, pytest_sessionfinish  # noqa: F401
"""

ORPHAN = """
import subprocess, sys


def test_starts_a_daemon_and_forgets_it(tmp_path):
    # a double fork: the grandchild's parent exits, so it is an orphan, as a killed kdbl-api's workers were
    code = "import os, time, sys\\nif os.fork() == 0:\\n    open(sys.argv[1], 'w').write(str(os.getpid()))\\n    time.sleep(600)\\n"
    subprocess.run([sys.executable, "-c", code, {pidfile!r}], check=True)


def test_reaps_what_it_starts():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
"""


def _run(folder: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=folder)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphaned_process_fails_the_session_names_its_test_and_is_killed(tmp_path):
    pidfile = tmp_path / "orphan.pid"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_orphan.py").write_text(textwrap.dedent(ORPHAN.format(pidfile=str(pidfile))))
    result = _run(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "2 passed" in output
    assert "1 process(es) started by the tests outlived the session" in output
    assert "started during test_orphan.py::test_starts_a_daemon_and_forgets_it" in output
    assert not _alive(int(pidfile.read_text()))


def test_a_session_whose_tests_reap_their_processes_passes(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_clean.py").write_text(textwrap.dedent(ORPHAN.split("def test_starts")[0]) + textwrap.dedent(
        "def test_reaps_what_it_starts():\n    proc = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
        "    proc.wait()\n"))
    result = _run(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "outlived" not in result.stdout + result.stderr
