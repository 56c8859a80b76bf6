"""`kdbl-control bench search --cache`: the search result cache through the whole HTTP path.

Indexes a BEIR corpus (default: SciFact), starts `kdbl-api` as its own process (cache on, defaults)
and, with one client sending raw JSON-RPC tools/call POSTs (lexical, limit 10):
  miss — each query the first time (the cache has never seen it): p50/p95;
  hit  — the same queries again, unchanged index: p50/p95 (every one must say meta.cache_hit);
  agent session — a replayed reformulation loop on fresh queries: each query, then two reformulations
           that repeat earlier calls (its distinctive terms — new the first time, asked again as the
           agent's third step — and the previous query once more), so 4 calls a query, at most 2 of them
           repeats; reports the measured hit rate (meta.cache_hit) against that bound, and the p50 of
           the session's calls.
The numbers go into docs/benchmarks.md ("Search cache and cursors").
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from kdbl_control.beir import ensure_indexed, load_queries, materialise_beir
from kdbl_control.bench import pct, start_api, stop_api
from kdbl_control.loadgen import Connection, encode_post
from kdbl_control.up import free_port
from kdbl_core.errors import ConfigError

TENANT = "bench-search"
LIMIT = 10


def distinctive(query: str) -> str:
    """An agent's reformulation: the query's four longest words (its rarest, roughly), in their order."""
    words = re.findall(r"[A-Za-z0-9-]+", query)
    keep = set(sorted(words, key=len, reverse=True)[:4])
    return " ".join(w for w in words if w in keep) or query


def session(queries: list[str]) -> list[str]:
    """The replayed agent loop: q, distinctive(q), the previous query again, distinctive(q) again."""
    calls: list[str] = []
    for i, query in enumerate(queries):
        calls += [query, distinctive(query), queries[i - 1] if i else query, distinctive(query)]
    return calls


def _cache_hit(body: bytes) -> bool:
    if not body.lstrip().startswith(b"{"):
        body = next(line[5:] for line in body.splitlines() if line.startswith(b"data:"))
    message = json.loads(body)
    if "error" in message:
        raise RuntimeError(f"search_content failed: {message['error']}")
    return bool(message["result"]["structuredContent"]["meta"]["cache_hit"])


async def _calls(conn: Connection, url: str, headers: dict[str, str], queries: list[str]) -> tuple[list[float], int]:
    times, hits = [], 0
    for i, query in enumerate(queries):
        body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
            "name": "search_content", "arguments": {"query": query, "mode": "lexical", "limit": LIMIT}}}).encode()
        start = time.perf_counter()
        _, answer = await conn.post(encode_post(url, body, headers))
        times.append((time.perf_counter() - start) * 1000)
        hits += _cache_hit(answer)
    return times, hits


async def _measure(url: str, token: str, measured: list[str], fresh: list[str]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    conn = Connection(url)
    try:
        await _calls(conn, url, headers, ["warm the connection and the token cache"])
        miss, miss_hits = await _calls(conn, url, headers, measured)
        hit, hit_hits = await _calls(conn, url, headers, measured)
        calls = session(fresh)
        agent, agent_hits = await _calls(conn, url, headers, calls)
    finally:
        await conn.close()
    repeats = len(calls) - len(set(calls))
    return {
        "miss": {"p50_ms": pct(miss, 0.5), "p95_ms": pct(miss, 0.95), "n": len(miss), "cache_hits": miss_hits},
        "hit": {"p50_ms": pct(hit, 0.5), "p95_ms": pct(hit, 0.95), "n": len(hit), "cache_hits": hit_hits},
        "agent_session": {"calls": len(calls), "repeats": repeats, "cache_hits": agent_hits,
                          "hit_rate": round(agent_hits / len(calls), 3), "p50_ms": pct(agent, 0.5)},
    }


def run_cache_bench(owner_url: str, dataset: Path, work_dir: Path, *, n_queries: int) -> dict[str, Any]:
    queries = load_queries(dataset, 2 * n_queries)
    if len(queries) <= n_queries:  # the agent session needs fresh queries beyond the measured ones
        raise ConfigError(f"{dataset} has {len(queries)} queries: the agent session needs more than --queries "
                          f"({n_queries}); pass --queries {max(1, len(queries) // 2)} or fewer")
    docs = work_dir / "bench-docs"
    materialise_beir(dataset, docs)
    indexed = ensure_indexed(owner_url, docs, TENANT)
    port = free_port()
    api = start_api(owner_url, port)
    try:
        result = asyncio.run(_measure(f"http://127.0.0.1:{port}/mcp", indexed["token"], queries[:n_queries],
                                      queries[n_queries:]))
    finally:
        stop_api(api)
    return {"dataset": str(dataset), "chunks": indexed["chunks"], "queries": n_queries, "limit": LIMIT, **result,
            "date": time.strftime("%Y-%m-%d")}


def summarise(result: dict[str, Any]) -> str:
    miss, hit, agent = result["miss"], result["hit"], result["agent_session"]
    return "\n".join([
        f"search cache, lexical limit {result['limit']}, {result['queries']} queries, {result['chunks']} chunks",
        f"  miss (first time):  p50 {miss['p50_ms']} ms  p95 {miss['p95_ms']} ms  (cache hits {miss['cache_hits']})",
        f"  hit (same again):   p50 {hit['p50_ms']} ms  p95 {hit['p95_ms']} ms  (cache hits {hit['cache_hits']}/{hit['n']})",
        f"  agent session: {agent['calls']} calls, {agent['repeats']} repeats, {agent['cache_hits']} cache hits "
        f"(hit rate {agent['hit_rate']}), p50 {agent['p50_ms']} ms",
    ])
