"""Several kdbl-api processes on one port, each with its own SO_REUSEPORT listening socket, supervised.

uvicorn's own multi-worker mode shares one listening socket, and its event loop accepts every pending
connection in one go: when 16 keep-alive clients connect at once, one worker often takes 12 or all 16
of them and the other idles for the life of those connections (16-client throughput swung between
152 and 202 req/s from run to run, docs/benchmarks.md). With a socket per worker, the kernel spreads
new connections over the workers by a hash of the address pair.

The supervisor forwards SIGTERM/SIGINT to the workers, waits for them and exits 0. A worker that dies
on its own (kill -9, the OOM killer, a crash) is logged and replaced by a new process that binds its
own socket on the same port; the others keep serving meanwhile, so one crashed process costs only the
requests it held. (Before this, a dead worker took the whole process down: with 2 workers and a client
calling all along, kill -9 of one worker failed 1,422 of 1,736 requests and nothing answered until the
pod restarted, issue 27. Measured here, one client on a new connection per call for 12 s with kill -9
at 2 s: before, 195 answered and every call after the kill failed; now 642 answered, none failed.)

A worker that dies within CRASH_WINDOW_S (30 s) of its start counts as a start-up crash: each one in a
row waits longer before the next start (Backoff: 0.5, 1, 2, 4 s), and the MAX_QUICK_DEATHS-th (5th)
makes the supervisor stop the rest and exit 1, so a configuration that cannot start shows in Kubernetes
as a crash loop instead of a process that spins. A worker that lived longer resets the count and is
replaced at once. (30 s, not a few: a start takes ~2 s here, but several on a busy 2-core node.)

Workers die with their supervisor: each asks the kernel for SIGTERM when its parent dies
(prctl PR_SET_PDEATHSIG, Linux) and then checks that its parent is still the supervisor, which closes
the window between its start and that call. Without it a SIGKILLed supervisor left its workers
listening on the port for as long as nobody noticed (27 minutes in the issue's run). SIGTERM, not
SIGKILL: uvicorn stops listening at once and lets the requests in hand finish. On systems without
prctl (macOS, for development) the workers outlive a SIGKILLed supervisor.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import uvicorn

from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

BACKLOG = 2048
CRASH_WINDOW_S = 30.0  # a worker that dies this soon after its start crashed at start-up (a start takes ~2 s)
MAX_QUICK_DEATHS = 5  # start-up crashes in a row before the supervisor gives up (exit 1)
FIRST_DELAY_S = 0.5  # the wait before restarting after the first start-up crash; doubles with each
_PR_SET_PDEATHSIG = 1


def bound_socket(host: str, port: int) -> socket.socket:
    """Bound, not listening: uvicorn calls listen() once the app has started, so the kernel sends no
    connection to a worker that is still starting (a socket that does not listen gets none)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


def listen_ports(settings: Settings) -> list[int]:
    """The API port, and the metrics port unless it is 0."""
    return [settings.api_port] + ([settings.metrics_port] if settings.metrics_port else [])


def die_with_parent(parent_pid: int) -> None:
    """SIGTERM this process when its parent dies (Linux); exits at once if the parent is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols: glibc's or musl's prctl
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the call above: nobody would signal us
        os._exit(1)


def _worker(host: str, ports: list[int], options: dict[str, Any], parent_pid: int) -> None:
    die_with_parent(parent_pid)
    sockets = [bound_socket(host, port) for port in ports]
    config = uvicorn.Config("kdbl_api.main:build", factory=True, backlog=BACKLOG, **options)
    uvicorn.Server(config).run(sockets=sockets)  # exits 3 when the app's start-up fails


@dataclass
class Backoff:
    """When to restart a dead worker, and when to give up: start-up crashes in a row wait longer each."""

    crash_window_s: float = CRASH_WINDOW_S
    max_quick_deaths: int = MAX_QUICK_DEATHS
    first_delay_s: float = FIRST_DELAY_S
    quick_deaths: int = field(default=0, init=False)

    def died(self, lived_s: float) -> float | None:
        """Seconds to wait before starting a replacement of a worker that lived `lived_s`; None: give up."""
        if lived_s >= self.crash_window_s:
            self.quick_deaths = 0
            return 0.0
        self.quick_deaths += 1
        if self.quick_deaths >= self.max_quick_deaths:
            return None
        return self.first_delay_s * 2 ** (self.quick_deaths - 1)


@dataclass
class _Slot:
    name: str
    proc: BaseProcess | None = None
    started: float = 0.0
    restart_at: float | None = None  # set while the slot waits out its back-off


class Supervisor:
    """Keeps `count` worker processes running (module docstring); `run` returns the exit code."""

    def __init__(self, count: int, start: Callable[[str], BaseProcess], *, backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.slots = [_Slot(f"kdbl-api-{i}") for i in range(count)]
        self._start = start
        self.backoff = backoff or Backoff()
        self._clock = clock
        self.stopping = False

    def stop(self, _signum: int = signal.SIGTERM, _frame: FrameType | None = None) -> None:
        # SIGTERM even for Ctrl-C: the workers got that SIGINT from the terminal already, and uvicorn
        # treats a second SIGINT as "exit without draining"
        self.stopping = True
        for slot in self.slots:
            slot.restart_at = None
            if slot.proc is not None and slot.proc.is_alive():
                slot.proc.terminate()

    def _launch(self, slot: _Slot) -> None:
        slot.restart_at = None
        slot.proc = self._start(slot.name)
        slot.started = self._clock()
        if self.stopping:  # the signal came while it started: stop() did not see it
            slot.proc.terminate()

    def _reap(self, slot: _Slot) -> bool:
        """Handles a slot whose process has exited; False when the supervisor gives up."""
        proc = slot.proc
        assert proc is not None
        proc.join()
        slot.proc = None
        if self.stopping:
            return True
        lived = self._clock() - slot.started
        delay = self.backoff.died(lived)
        fields = {"worker": slot.name, "pid": proc.pid, "exitcode": proc.exitcode, "lived_s": round(lived, 1)}
        if delay is None:
            log.error("api worker keeps dying at start-up; stopping the others",
                      extra={**fields, "quick_deaths": self.backoff.quick_deaths})
            return False
        log.warning("api worker died; starting a new one", extra={**fields, "restart_in_s": delay})
        slot.restart_at = self._clock() + delay
        return True

    def run(self) -> int:
        """Until a signal (0) or until workers keep crashing at start-up (1)."""
        for slot in self.slots:
            if not self.stopping:
                self._launch(slot)
        failed = False
        while True:
            now = self._clock()
            for slot in self.slots:
                if slot.restart_at is not None and slot.restart_at <= now and not self.stopping:
                    self._launch(slot)
            running = [s for s in self.slots if s.proc is not None]
            pending = [s.restart_at for s in self.slots if s.restart_at is not None]
            if not running and not pending:
                return 1 if failed else 0
            timeout = max(0.0, min(pending) - now) if pending else None
            ready = wait([s.proc.sentinel for s in running], timeout=timeout)  # type: ignore[union-attr]
            for slot in running:
                assert slot.proc is not None
                if slot.proc.sentinel in ready and not self._reap(slot) and not failed:
                    failed = True
                    self.stop()


def serve(settings: Settings, options: dict[str, Any]) -> int:
    """Run KDBL_API_WORKERS processes until a signal (exit 0) or until they keep dying at start-up (exit 1).

    Each binds the API port and the metrics port; a scrape reads the process the kernel picks."""
    host, ports = settings.api_host, listen_ports(settings)
    for port in ports:  # fail here, in the supervisor, if a port is taken
        bound_socket(host, port).close()
    context = multiprocessing.get_context("spawn")
    parent_pid = os.getpid()

    def start(name: str) -> BaseProcess:
        # from this (the main) thread: PR_SET_PDEATHSIG fires when the thread that started the child ends
        proc = context.Process(target=_worker, args=(host, ports, options, parent_pid), name=name, daemon=False)
        proc.start()
        return proc

    supervisor = Supervisor(settings.api_workers, start)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    return supervisor.run()
