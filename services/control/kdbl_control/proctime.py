"""CPU seconds used by processes on this machine (Linux /proc), for per-request cost in benchmarks.

A request's cost on a shared 2-core machine is best read as CPU, not wall time: the API process
(and its worker processes), the Postgres server (postmaster and every backend) and the load
generator each report what they used between two snapshots.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu(pid: int) -> float:
    """User + system seconds of `pid`, plus those of its children that have exited."""
    fields = _stat(pid)
    return sum(int(f) for f in fields[11:15]) / _TICKS if fields else 0.0


def tree_cpu(pid: int) -> float:
    """`pid` and its live descendants (an API supervisor and its workers; a postmaster and its backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += process_cpu(current)
        todo.extend(children.get(current, ()))
    return total


def postmaster_pid(pgdata: Path) -> int | None:
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


class CpuMeter:
    """CPU seconds of the named process trees (and of this process) between start() and stop()."""

    def __init__(self, **pids: int | None) -> None:
        self._pids = {name: pid for name, pid in pids.items() if pid is not None}
        self._start: dict[str, float] = {}

    def _snapshot(self) -> dict[str, float]:
        snap = {name: tree_cpu(pid) for name, pid in self._pids.items()}
        snap["load generator"] = time.process_time()
        return snap

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> dict[str, float]:
        end = self._snapshot()
        return {name: end[name] - self._start[name] for name in end}
