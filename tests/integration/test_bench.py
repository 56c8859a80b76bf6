"""`kdbl-control bench search` end to end on a tiny BEIR folder: real crawl, real kdbl-api process, loadgen."""

from __future__ import annotations

import asyncio
import gc
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


def _reaped(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists()  # a zombie (killed, never waited for) still has its /proc entry


def test_start_api_fails_at_once_with_the_output_of_a_kdbl_api_that_exits_before_it_is_ready(owner_url):
    from kdbl_control.bench import start_api
    from kdbl_control.up import free_port

    # kdbl-api refuses this configuration at start (exit 2): the legacy SSE transport needs one process
    with pytest.raises(RuntimeError) as failed:
        start_api(owner_url, free_port(), {"KDBL_API_WORKERS": "2", "KDBL_LEGACY_SSE_ENABLED": "true"})
    message = str(failed.value)
    del failed
    gc.collect()  # a Popen dropped without wait() would warn here (ResourceWarning: an error in these tests)
    assert "exited with 2 before it became ready" in message
    assert "KDBL_LEGACY_SSE_ENABLED needs KDBL_API_WORKERS=1" in message  # its own output, in the error
    assert _reaped(int(message.split("pid ", 1)[1].split(")", 1)[0]))


def test_start_api_reaps_a_kdbl_api_that_is_not_ready_within_its_bound(owner_url):
    from kdbl_control.bench import listening_sockets, start_api
    from kdbl_control.up import free_port

    port = free_port()
    with pytest.raises(RuntimeError) as failed:
        start_api(owner_url, port, {"KDBL_API_WORKERS": "2"}, bound_s=0)
    message = str(failed.value)
    del failed
    gc.collect()
    assert "did not become ready in 0 s" in message
    assert _reaped(int(message.split("pid ", 1)[1].split(")", 1)[0])) and listening_sockets(port) == 0
