"""`kdbl-control bench search` end to end on a tiny BEIR folder: real crawl, real kdbl-api process, loadgen."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import pytest
from helpers import running_api, write_beir

from kdbl_control.bench import run_search_bench
from kdbl_control.loadgen import Connection, LoadgenError, encode_post, jsonrpc_error

DOCS = {
    "d1": ("Okapi migration", "The okapi migration season starts when the rains come to the forest."),
    "d2": ("Aspirin", "Aspirin reduces fever and headache in most adult patients."),
    "d3": ("Parking", "Clinic opening hours and parking information for visitors."),
}
QUERIES = ["okapi migration", "aspirin fever", "parking hours"]


@pytest.fixture
def tiny_beir(tmp_path):
    return write_beir(tmp_path / "tiny", DOCS, {f"q{i}": query for i, query in enumerate(QUERIES)})


def test_bench_search_measures_the_real_stack(owner_url, tiny_beir, tmp_path, unique, monkeypatch):
    monkeypatch.setattr("kdbl_control.bench.TENANT", f"bench-{unique}")
    result = run_search_bench(owner_url, tiny_beir, tmp_path / "work", clients=4, seconds=1.0, n_queries=3)
    assert result["documents"] == 3 and result["chunks"] == 3 and result["queries"] == 3
    one, many = result["http_1_client"], result["http_n_clients"]
    assert one["n"] == 3 and one["errors"] == 0 and one["p50_ms"] > 0
    assert many["clients"] == 4 and many["requests"] > 4 and many["errors"] == 0, many["error_samples"]
    assert result["floor_sql"]["n"] == 3
    # every request costs the API process and the load generator some CPU (no postmaster pid given here)
    assert set(many["cpu_ms_per_request"]) == {"api", "load generator"}
    assert all(ms > 0 for ms in many["cpu_ms_per_request"].values())


def test_loadgen_reports_http_and_jsonrpc_failures(owner_url):
    with running_api(owner_url) as base:
        url = f"{base}/mcp"

        async def post(headers: dict[str, str]) -> str | None:
            conn = Connection(url)
            try:
                status, body = await conn.post(encode_post(url, b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
                                                           headers))
            finally:
                await conn.close()
            return jsonrpc_error(status, body)

        assert asyncio.run(post({"Accept": "application/json, text/event-stream"})) == "HTTP 401"
        assert asyncio.run(post({"Authorization": "Bearer kdblpat_nope_nope",
                                 "Accept": "application/json"})) == "HTTP 401"

    async def refused() -> None:
        await Connection(url).post(b"")

    with pytest.raises((LoadgenError, OSError)):
        asyncio.run(refused())


def test_jsonrpc_error_reads_the_answer() -> None:
    assert jsonrpc_error(200, b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}') is None
    assert jsonrpc_error(200, b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}') == "tool error"
    assert jsonrpc_error(200, b'{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"bad limit"}}') == \
        "JSON-RPC error -32602: bad limit"
    assert jsonrpc_error(200, b"<html>") == "response is not JSON"
    assert jsonrpc_error(429, b"{}") == "HTTP 429"


def _established_per_process(pids: list[str], port: int) -> dict[str, int]:
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


def test_kdbl_api_with_two_worker_processes_serves_searches_and_shares_connections(owner_url, tiny_beir, tmp_path,
                                                                                    unique):
    from kdbl_control.beir import ensure_indexed, materialise_beir
    from kdbl_control.bench import _requests, many_clients, start_api
    from kdbl_control.up import free_port

    docs = tmp_path / "docs"
    materialise_beir(tiny_beir, docs)
    indexed = ensure_indexed(owner_url, docs, f"workers-{unique}")
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    api = start_api(owner_url, port, {"KDBL_API_WORKERS": "2"})
    try:
        children = Path(f"/proc/{api.pid}/task/{api.pid}/children").read_text().split()
        workers = [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
        assert len(workers) == 2  # the supervisor started two worker processes

        async def sixteen_keepalive_connections() -> dict[str, int]:
            conns = [Connection(url) for _ in range(16)]
            request = _requests(url, indexed["token"], QUERIES[:1], "lexical")[0]
            try:
                statuses = await asyncio.gather(*(c.post(request) for c in conns))
                assert all(status == 200 for status, _ in statuses)
                return _established_per_process(workers, port)
            finally:
                await asyncio.gather(*(c.close() for c in conns))

        # one socket per worker (SO_REUSEPORT): the kernel spreads connections that arrive together;
        # a shared socket let one worker accept all 16 (P(a worker gets none) is 2/65536 here)
        held = asyncio.run(sixteen_keepalive_connections())
        assert sum(held.values()) == 16 and min(held.values()) >= 1, held
        result = asyncio.run(many_clients(url, indexed["token"], QUERIES, 4, 1.0, warmup_s=0.5))
        assert result["requests"] > 4 and result["errors"] == 0, result["error_samples"]
    finally:
        api.terminate()
        api.wait(timeout=20)
    assert api.returncode == 0  # SIGTERM: the supervisor stopped both workers and exited cleanly
