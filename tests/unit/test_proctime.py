"""CPU accounting for benchmarks reads /proc: a busy child process shows up in its parent's tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kdbl_control.proctime import CpuMeter, postmaster_pid, process_cpu, tree_cpu

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"


def test_a_live_busy_child_counts_in_the_tree_not_in_the_process_alone() -> None:
    child = subprocess.Popen([sys.executable, "-c", BUSY + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while process_cpu(child.pid) < 0.25 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tree_cpu(os.getpid()) - process_cpu(os.getpid()) >= 0.25
    finally:
        child.communicate(b"")


def test_the_meter_reports_cpu_between_start_and_stop() -> None:
    meter = CpuMeter(me=os.getpid(), gone=None)
    meter.start()
    subprocess.run([sys.executable, "-c", BUSY], check=True)  # a child that has exited counts (cutime)
    used = meter.stop()
    assert set(used) == {"me", "load generator"}
    assert used["me"] >= 0.25


def test_postmaster_pid_reads_the_first_line(tmp_path) -> None:
    (tmp_path / "postmaster.pid").write_text("4242\n/data\n")
    assert postmaster_pid(tmp_path) == 4242
    assert postmaster_pid(tmp_path / "missing") is None
