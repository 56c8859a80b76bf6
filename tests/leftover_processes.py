"""No process a test starts outlives the test session: the session ends by failing on leftovers.

A killed `kdbl-api` parent once left its two uvicorn workers listening on a loopback port for 27 minutes
after the suite ended, and a helper that killed without `wait()` surfaced as a ResourceWarning in an
unrelated later test. Processes that lose their parent are normally adopted by init, out of sight; here
the pytest process makes itself a child subreaper (prctl PR_SET_CHILD_SUBREAPER), so every descendant a
test started, orphaned or not, stays its descendant. When the session finishes (fixtures torn down), any
still alive after a short grace is named with the test that was running when it started, killed with
its own descendants, and the run fails.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 15.0  # for processes a fixture stopped that are still shutting down
TICKS = os.sysconf("SC_CLK_TCK")
# Python's own helpers that live as long as the interpreter, not as long as a test
OWN_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")

_tests: list[tuple[float, str]] = []  # (boot-time seconds at the test's start, its node id)
_enabled = False


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    state: str
    started_s: float  # seconds since boot
    cmdline: str


def _read(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if any(helper in raw for helper in OWN_HELPERS):
        return None
    return Proc(pid, int(fields[1]), fields[0], int(fields[19]) / TICKS,
                raw.replace(b"\0", b" ").decode(errors="replace").strip()[:300])


def _children(parent: int) -> list[Proc]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _read(int(entry))) is not None and proc.ppid == parent:
            found.append(proc)
    return found


def _reap_zombies(procs: list[Proc]) -> list[Proc]:
    alive = []
    for proc in procs:
        if proc.state == "Z":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(proc.pid, os.WNOHANG)
        else:
            alive.append(proc)
    return alive


def _started_during(proc: Proc) -> str:
    name = "(before the first test)"
    for started, nodeid in _tests:
        if started > proc.started_s:
            break
        name = nodeid
    return name


def _kill_tree(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


def pytest_configure(config: pytest.Config) -> None:
    global _enabled
    libc = ctypes.CDLL(None, use_errno=True)
    _enabled = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _tests.append((time.clock_gettime(time.CLOCK_BOOTTIME), item.nodeid))


def leftovers(grace_s: float = GRACE_S) -> list[Proc]:
    """This process's live children (adopted orphans included) once `grace_s` has passed without them
    all ending; zombies are reaped on the way."""
    me = os.getpid()
    deadline = time.monotonic() + grace_s
    while True:
        alive = _reap_zombies(_children(me))
        if not alive or time.monotonic() >= deadline:
            return alive
        time.sleep(0.2)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _enabled or hasattr(session.config, "workerinput"):
        return
    found = leftovers()
    if not found:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(found)} process(es) started by the tests outlived the session (killed now):"]
    lines += [f"  pid {p.pid}, started during {_started_during(p)}: {p.cmdline}" for p in found]
    for proc in found:
        _kill_tree(proc.pid)
    # what those processes had started is ours now: end it too
    for _ in range(10):
        rest = _reap_zombies(_children(os.getpid()))
        if not rest:
            break
        for proc in rest:
            lines.append(f"  pid {proc.pid} (its descendant): {proc.cmdline}")
            _kill_tree(proc.pid)
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
