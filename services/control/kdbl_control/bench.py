"""`kdbl-control bench search`: lexical search_content latency through the whole stack, beside its floor.

Indexes a BEIR corpus (default: SciFact) through the real crawl pipeline, starts `kdbl-api` as its own
process (kdbl_api role, auth, RLS, audit), then measures with raw JSON-RPC POSTs:
  floor   — the same search plan (kdbl_core.search.plan.SearchPlan, lexical) run directly in one RLS
            transaction (no HTTP, no audit);
  1 client — sequential tools/call requests, p50/p95;
  N clients — concurrent requests for a fixed time: requests/s, p50/p95, errors.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from kdbl_control.beir import ensure_indexed, load_queries, materialise_beir
from kdbl_control.loadgen import Connection, LoadgenError, Outcome, encode_post, jsonrpc_error, run_clients
from kdbl_control.proctime import CpuMeter
from kdbl_control.up import free_port
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.connect import async_pool
from kdbl_core.db.urls import for_role
from kdbl_core.errors import ConfigError
from kdbl_core.search import pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import child_env, get_settings

TENANT = "bench-search"


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 2)


async def floor(owner_url: str, tenant_id, queries: list[str]) -> dict[str, float]:
    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=1, name="kdbl-bench-floor")
    principal = Principal(tenant_id=tenant_id, tenant_name=TENANT, subject="user:bench")
    settings = get_settings()
    times = []
    try:
        for query in queries:
            start = time.perf_counter()
            async with rls_transaction(pool, principal) as conn:  # the pipeline search_content runs, lexical
                await SearchPlan(pipeline.SearchRequest(query=query, mode="lexical", limit=20),
                                 settings=settings).run(conn)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        await pool.close()
    return {"p50_ms": pct(times, 0.5), "p95_ms": pct(times, 0.95), "n": len(times)}


def _body(i: int, query: str, mode: str) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": "search_content", "arguments": {"query": query, "mode": mode}}}).encode()


def _requests(url: str, token: str, queries: list[str], mode: str) -> list[bytes]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    return [encode_post(url, _body(i, q, mode), headers) for i, q in enumerate(queries)]


async def one_client(url: str, token: str, queries: list[str], mode: str = "lexical") -> dict[str, Any]:
    requests = _requests(url, token, queries, mode)
    conn = Connection(url)
    outcome = Outcome()
    try:
        await conn.post(requests[0])  # warm the token cache and the connection
        for request in requests:
            start = time.perf_counter()
            try:
                status, body = await conn.post(request)
                error = jsonrpc_error(status, body)
            except (LoadgenError, OSError) as exc:
                error = str(exc)
            outcome.record((time.perf_counter() - start) * 1000, error)
    finally:
        await conn.close()
    times = outcome.latencies_ms
    return {"p50_ms": pct(times, 0.5), "p95_ms": pct(times, 0.95), "n": len(times), "errors": outcome.errors,
            "error_samples": outcome.error_samples}


async def many_clients(url: str, token: str, queries: list[str], clients: int, seconds: float,
                       mode: str = "lexical", warmup_s: float = 3.0, meter: CpuMeter | None = None
                       ) -> dict[str, Any]:
    """Requests/s at steady state: an unmeasured warm-up first gets every pooled connection (in every
    API worker) its backend, catalog caches and prepared statements. With `meter`: CPU ms per request
    of each measured process tree."""
    requests = _requests(url, token, queries, mode)
    if warmup_s > 0:
        await run_clients(url, requests, clients=clients, seconds=warmup_s)
    if meter is not None:
        meter.start()
    outcome, elapsed = await run_clients(url, requests, clients=clients, seconds=seconds)
    used = meter.stop() if meter is not None else {}
    times = outcome.latencies_ms
    return {"clients": clients, "requests": len(times), "errors": outcome.errors, "seconds": round(elapsed, 1),
            "warmup_s": warmup_s,
            "requests_per_s": round(len(times) / elapsed, 1), "p50_ms": pct(times, 0.5),
            "p95_ms": pct(times, 0.95), "error_samples": outcome.error_samples,
            "cpu_ms_per_request": {name: round(1000 * sec / max(len(times), 1), 2) for name, sec in used.items()}}


def listening_sockets(port: int) -> int | None:
    """How many TCP sockets listen on `port` (Linux /proc; None elsewhere)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            return None
        for line in lines:
            fields = line.split()
            count += fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port
    return count


READY_BOUND_S = 300.0  # a generous ceiling: a start that still runs after it is stuck, not slow
STOP_BOUND_S = 20.0  # SIGTERM's grace (uvicorn drains its requests) before SIGKILL
_TAIL_LINES = 60


class ApiProcess(subprocess.Popen):
    """A `kdbl-api` process whose output goes on to this process's stderr, its last lines kept for errors."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        super().__init__(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.tail: collections.deque[bytes] = collections.deque(maxlen=_TAIL_LINES)
        self.relay = threading.Thread(target=self._relay, name=f"kdbl-api-{self.pid}-output", daemon=True)
        self.relay.start()

    def _relay(self) -> None:
        assert self.stdout is not None
        with self.stdout:  # EOF once the process and its workers are gone; closing it here leaves no warning
            for line in self.stdout:
                self.tail.append(line)
                os.write(2, line)  # the fd, not sys.stderr: a test's captured stream may be closed by then

    def output(self) -> str:
        return b"".join(self.tail).decode("utf-8", "replace")


def stop_api(proc: subprocess.Popen, bound_s: float = STOP_BOUND_S) -> int:
    """Reaps what start_api started, whatever state it is in: SIGTERM, a bounded wait, then SIGKILL."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=bound_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    code = proc.wait()
    if isinstance(proc, ApiProcess):
        proc.relay.join(timeout=bound_s)  # ends at EOF: when the last worker holding the pipe is gone
    return code


def _ready(port: int, workers: int) -> bool:
    try:
        ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
    listening = listening_sockets(port)
    return ready and (workers == 1 or listening is None or listening >= workers)


def start_api(owner_url: str, port: int, env: dict[str, str] | None = None,
              bound_s: float = READY_BOUND_S) -> ApiProcess:
    """`kdbl-api` as a process; returns once every worker process listens (each has its own socket).

    Waits while the process lives (a start with 2 workers and a model can take a minute on 2 busy cores),
    up to `bound_s`; a process that exits first fails at once with its output. On any failure the process
    is reaped (stop_api) before the error leaves; the caller stops a started one with stop_api."""
    env = child_env({**(env or {}), "KDBL_DATABASE_URL": for_role(owner_url, "kdbl_api"), "KDBL_MCP_ENABLED": "true",
                     "KDBL_API_HOST": "127.0.0.1", "KDBL_API_PORT": str(port), "KDBL_RATE_LIMIT_PER_MINUTE": "0",
                     "KDBL_LOG_LEVEL": "WARNING", "KDBL_METRICS_PORT": "0"})  # no metrics listener: nothing scrapes it
    workers = int(env.get("KDBL_API_WORKERS") or 1)
    proc = ApiProcess([sys.executable, "-m", "kdbl_api.main"], env)
    try:
        deadline = time.monotonic() + bound_s
        while not _ready(port, workers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"kdbl-api (pid {proc.pid}) did not become ready in {bound_s:.0f} s; its output:\n"
                                   + proc.output())
            try:  # the pause between probes: ends early when the process exits
                code = proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                continue
            proc.relay.join(timeout=STOP_BOUND_S)
            raise RuntimeError(f"kdbl-api (pid {proc.pid}) exited with {code} before it became ready; its output:\n"
                               + proc.output())
    except BaseException:
        stop_api(proc)
        raise
    return proc


def run_search_bench(owner_url: str, dataset: Path, work_dir: Path, *, clients: int, seconds: float,
                     n_queries: int, mode: str = "lexical", model_path: Path | None = None,
                     postgres_pid: int | None = None) -> dict[str, Any]:
    """`postgres_pid`: the local postmaster, to report Postgres CPU per request (embedded database)."""
    docs = work_dir / "bench-docs"
    n_docs = materialise_beir(dataset, docs)
    indexed = ensure_indexed(owner_url, docs, TENANT)
    queries = load_queries(dataset, n_queries)
    env: dict[str, str] = {}
    embedding = None
    if mode == "hybrid":
        if model_path is None:
            raise ConfigError("--mode hybrid needs an embedding model (--model or KDBL_EMBED_MODEL_PATH)")
        from kdbl_control.evaluate import embed_chunks
        from kdbl_core.embedder import Embedder

        embedder = Embedder(model_path, n_threads=os.cpu_count() or 2)
        embedding = embed_chunks(owner_url, indexed["tenant_id"], embedder, 32,
                                  lambda line: print(line, file=sys.stderr))
        del embedder
        env["KDBL_EMBED_MODEL_PATH"] = str(model_path)
    env["KDBL_SEARCH_CACHE_BYTES"] = "0"  # every call pays its search (the cache: bench search --cache)
    # one tenant's clients measure the server's capacity, not the fair share between tenants (bench fairness):
    # each client gets a slot unless KDBL_TENANT_MAX_IN_FLIGHT asks for more
    env["KDBL_TENANT_MAX_IN_FLIGHT"] = str(max(clients, get_settings().tenant_max_in_flight))
    port = free_port()
    api = start_api(owner_url, port, env)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        result = {
            "dataset": str(dataset), "mode": mode, "documents": n_docs, "chunks": indexed["chunks"],
            "queries": len(queries), "crawl": indexed["crawl"], "embedding": embedding,
            "floor_sql": asyncio.run(floor(owner_url, indexed["tenant_id"], queries)),
            "http_1_client": asyncio.run(one_client(url, indexed["token"], queries, mode)),
            "http_n_clients": asyncio.run(many_clients(url, indexed["token"], queries, clients, seconds, mode,
                                                       meter=CpuMeter(api=api.pid, postgres=postgres_pid))),
            "api_workers": get_settings().api_workers,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "date": time.strftime("%Y-%m-%d"),
        }
    finally:
        stop_api(api)
    return result


def default_work_dir() -> Path:
    return Path(tempfile.gettempdir()) / "kdbl-bench"


def summarise(result: dict[str, Any]) -> str:
    rows = [
        ("crawl (files/s)", result["crawl"]["files_per_s"], "", ""),
        ("floor: lexical SQL in one RLS tx", result["floor_sql"]["p50_ms"], result["floor_sql"]["p95_ms"], ""),
        (f"{result['mode']}: HTTP+auth+RLS+audit, 1 client", result["http_1_client"]["p50_ms"], result["http_1_client"]["p95_ms"],
         f"errors {result['http_1_client']['errors']}"),
        (f"{result['mode']}: HTTP, {result['http_n_clients']['clients']} clients", result["http_n_clients"]["p50_ms"],
         result["http_n_clients"]["p95_ms"],
         f"{result['http_n_clients']['requests_per_s']} req/s, errors {result['http_n_clients']['errors']}"),
    ]
    lines = [f"{result['documents']} documents, {result['chunks']} chunks, {result['queries']} queries",
             f"{'':34} {'p50 ms':>8} {'p95 ms':>8}"]
    lines += [f"{name:34} {p50!s:>8} {p95!s:>8}  {extra}" for name, p50, p95, extra in rows]
    cpu = result["http_n_clients"].get("cpu_ms_per_request")
    if cpu:
        lines.append(f"CPU ms per request at {result['http_n_clients']['clients']} clients "
                     f"({result.get('api_workers', 1)} API process(es)): "
                     + ", ".join(f"{name} {ms}" for name, ms in cpu.items()))
    return "\n".join(lines)

