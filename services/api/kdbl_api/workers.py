"""Several kdbl-api processes on one port, each with its own SO_REUSEPORT listening socket.

uvicorn's own multi-worker mode shares one listening socket, and its event loop accepts every pending
connection in one go: when 16 keep-alive clients connect at once, one worker often takes 12 or all 16
of them and the other idles for the life of those connections (16-client throughput swung between
152 and 202 req/s from run to run, docs/benchmarks.md). With a socket per worker, the kernel spreads
new connections over the workers by a hash of the address pair.

The supervisor forwards SIGTERM/SIGINT to the workers and waits for them. A worker that dies on its
own takes the others down and the process exits non-zero, so Kubernetes restarts the pod.
"""

from __future__ import annotations

import multiprocessing
import signal
import socket
import sys
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any

import uvicorn

from kdbl_core.settings import Settings

BACKLOG = 2048


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


def _worker(host: str, ports: list[int], options: dict[str, Any]) -> None:
    sockets = [bound_socket(host, port) for port in ports]
    config = uvicorn.Config("kdbl_api.main:build", factory=True, backlog=BACKLOG, **options)
    uvicorn.Server(config).run(sockets=sockets)


def serve(settings: Settings, options: dict[str, Any]) -> int:
    """Run KDBL_API_WORKERS processes until a signal (exit 0) or until one of them dies (exit 1).

    Each binds the API port and the metrics port; a scrape reads the process the kernel picks."""
    host, ports = settings.api_host, listen_ports(settings)
    for port in ports:  # fail here, in the supervisor, if a port is taken
        bound_socket(host, port).close()
    context = multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = [
        context.Process(target=_worker, args=(host, ports, options), name=f"kdbl-api-{i}", daemon=False)
        for i in range(settings.api_workers)
    ]
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        # SIGTERM even for Ctrl-C: the workers got that SIGINT from the terminal already, and uvicorn
        # treats a second SIGINT as "exit without draining"
        nonlocal stopping
        stopping = True
        for proc in procs:
            if proc.is_alive():
                proc.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for proc in procs:
        proc.start()
    failed = False
    while any(proc.is_alive() for proc in procs):
        for proc in procs:
            proc.join(timeout=0.5)
            if not proc.is_alive() and not stopping:
                failed = True
                print(f"kdbl-api: worker {proc.name} exited with {proc.exitcode}; stopping the others",
                      file=sys.stderr)
                stop(signal.SIGTERM, None)
    return 1 if failed else 0

