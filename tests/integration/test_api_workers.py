"""`kdbl-api` with KDBL_API_WORKERS=2 as real processes (kdbl_api.workers): connections spread over the
workers' own sockets, a worker killed with SIGKILL is replaced while a client keeps calling, workers die
with a SIGKILLed supervisor, and workers that keep crashing at start-up end the supervisor non-zero.

Each test starts kdbl-api through kdbl_control.bench.start_api and reaps it with stop_api; a worker a
test saw is killed at the end if it is still there (an orphan is not this process's child to reap).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import wait_until, write_beir

from kdbl_control.beir import ensure_indexed, materialise_beir
from kdbl_control.bench import ApiProcess, _body, _requests, listening_sockets, many_clients, start_api, stop_api
from kdbl_control.loadgen import Connection
from kdbl_control.up import free_port
from kdbl_core.settings import child_env

DOCS = {
    "d1": ("Okapi migration", "The okapi migration season starts when the rains come to the forest."),
    "d2": ("Aspirin", "Aspirin reduces fever and headache in most adult patients."),
}
QUERIES = ["okapi migration", "aspirin fever"]
TWO = {"KDBL_API_WORKERS": "2"}


def gone(pid: int) -> bool:
    """The process has exited (no longer in /proc, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def workers_of(parent: int) -> list[int]:
    """The supervisor's live worker processes (its children running multiprocessing's spawn_main)."""
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return []
    found = []
    for child in children:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes() and not gone(int(child)):
                found.append(int(child))
    return found


def _established_per_process(pids: list[int], port: int) -> dict[int, int]:
    """How many established TCP connections to `port` each process holds (from /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    counts = {}
    for pid in pids:
        held = 0
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                held += os.readlink(fd) in inodes
        counts[pid] = held
    return counts


async def sixteen_keepalive_connections(url: str, token: str, workers: list[int], port: int) -> dict[int, int]:
    """16 connections opened together, each answering one search, and how many each worker holds."""
    conns = [Connection(url) for _ in range(16)]
    request = _requests(url, token, QUERIES[:1], "lexical")[0]
    try:
        statuses = await asyncio.gather(*(c.post(request) for c in conns))
        assert all(status == 200 for status, _ in statuses)
        return _established_per_process(workers, port)
    finally:
        await asyncio.gather(*(c.close() for c in conns))


@pytest.fixture
def indexed(owner_url, tmp_path, unique) -> dict[str, Any]:
    beir = write_beir(tmp_path / "tiny", DOCS, {f"q{i}": query for i, query in enumerate(QUERIES)})
    materialise_beir(beir, tmp_path / "docs")
    return ensure_indexed(owner_url, tmp_path / "docs", f"workers-{unique}")


@pytest.fixture
def two_workers(owner_url):
    """kdbl-api with 2 workers on a free port: (process, port, its workers); every worker seen is ended."""
    port = free_port()
    api = start_api(owner_url, port, TWO)
    seen: set[int] = set()
    try:
        workers = workers_of(api.pid)
        seen.update(workers)
        yield api, port, workers, seen
    finally:
        stop_api(api)
        for pid in seen:  # an orphan (the supervisor's death did not take it) is killed, not left listening
            if not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_two_worker_processes_serve_searches_and_share_connections(two_workers, indexed):
    api, port, workers, _ = two_workers
    url = f"http://127.0.0.1:{port}/mcp"
    assert len(workers) == 2  # the supervisor started two worker processes
    # one socket per worker (SO_REUSEPORT): the kernel spreads connections that arrive together;
    # a shared socket let one worker accept all 16 (P(a worker gets none) is 2/65536 here)
    held = asyncio.run(sixteen_keepalive_connections(url, indexed["token"], workers, port))
    assert sum(held.values()) == 16 and min(held.values()) >= 1, held
    result = asyncio.run(many_clients(url, indexed["token"], QUERIES, 4, 1.0, warmup_s=0.5))
    assert result["requests"] > 4 and result["errors"] == 0, result["error_samples"]
    assert stop_api(api) == 0  # SIGTERM: the supervisor stopped both workers and exited cleanly
    assert all(gone(pid) for pid in workers)


def test_a_worker_killed_with_sigkill_is_replaced_while_a_client_keeps_calling(two_workers, indexed):
    api, port, workers, seen = two_workers
    url = f"http://127.0.0.1:{port}/mcp"
    victim, survivor = workers
    request = _body(0, QUERIES[0], "lexical")
    headers = {"Authorization": f"Bearer {indexed['token']}", "Accept": "application/json, text/event-stream",
               "Content-Type": "application/json"}

    async def scenario() -> tuple[list[bool], int, list[int]]:
        outcomes: list[bool] = []
        stop = asyncio.Event()

        async def client() -> None:  # a new connection per call: the kernel picks a worker each time
            async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as http:
                while not stop.is_set():
                    try:
                        resp = await http.post(url, content=request, headers=headers)
                        outcomes.append(resp.status_code == 200 and "error" not in resp.json())
                    except httpx.TransportError:
                        outcomes.append(False)

        async def until(check: Callable[[], Any], what: str, timeout: float = 120) -> Any:
            return await asyncio.to_thread(wait_until, check, timeout, what)

        task = asyncio.create_task(client())
        try:
            await until(lambda: len(outcomes) >= 5, "the client's first calls")
            os.kill(victim, signal.SIGKILL)

            def replaced() -> list[int] | None:
                now = workers_of(api.pid)
                seen.update(now)
                return now if (len(now) == 2 and victim not in now and survivor in now
                               and listening_sockets(port) == 2) else None

            now = await until(replaced, "a new worker listening in place of the killed one")
            after = len(outcomes) + 1  # a call in flight now may have started before the new worker listened
            await until(lambda: len(outcomes) >= after + 30, "30 calls after the replacement")
        finally:
            stop.set()
            await task
        return outcomes, after, now

    outcomes, after, now = asyncio.run(scenario())
    assert api.poll() is None  # the supervisor kept running
    assert all(outcomes[after:]), f"{outcomes[after:].count(False)} of {len(outcomes[after:])} calls failed"
    assert outcomes[:after].count(True) >= 5  # answered before, and the failures are only around the kill
    # the new worker takes its share of connections that arrive together
    held = asyncio.run(sixteen_keepalive_connections(url, indexed["token"], now, port))
    assert sum(held.values()) == 16 and min(held.values()) >= 1, held
    assert "api worker died; starting a new one" in api.output()
    assert stop_api(api) == 0


def test_sigkilling_the_supervisor_takes_its_workers_with_it(two_workers):
    api, port, workers, _ = two_workers
    assert len(workers) == 2 and listening_sockets(port) == 2
    api.kill()
    assert api.wait() == -signal.SIGKILL
    # each worker gets SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops listening
    wait_until(lambda: all(gone(pid) for pid in workers), 60, "the workers to exit after their supervisor")
    assert listening_sockets(port) == 0


def test_workers_that_keep_crashing_at_start_up_end_kdbl_api_with_exit_1(owner_url):
    # the owner role bypasses RLS: every worker's app refuses to start (kdbl_core.db.connect.check_runtime_role)
    env = child_env({"KDBL_DATABASE_URL": owner_url, "KDBL_MCP_ENABLED": "true", "KDBL_API_HOST": "127.0.0.1",
                     "KDBL_API_PORT": str(free_port()), "KDBL_METRICS_PORT": "0", "KDBL_LOG_LEVEL": "WARNING",
                     **TWO})
    api = ApiProcess([sys.executable, "-m", "kdbl_api.main"], env)
    try:
        code = api.wait(timeout=300)  # five start-up crashes in a row, with 0.5 + 1 + 2 + 4 s between them
    except subprocess.TimeoutExpired:
        code = None
    finally:
        stop_api(api)
    output = api.output()
    assert code == 1, output
    assert output.count("api worker died; starting a new one") == 4, output
    assert "api worker keeps dying at start-up" in output
