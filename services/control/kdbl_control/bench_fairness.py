"""`kdbl-control bench fairness`: a quiet tenant's search latency alone, then beside a noisy neighbour.

Issue 27 §3 measured a quiet tenant's p95 going from 152 ms to 2,126 ms while another tenant sent heavy
but allowed calls. This bench repeats that through the whole stack: it indexes a BEIR corpus (default:
SciFact) into two tenants (the crawl twice: each tenant its own copy), allows both get_contents,
find_similar and answer, starts `kdbl-api` as its own process (installation defaults: fair share on,
no rate tiers, result cache off so that repeated queries do their work) and measures with raw
JSON-RPC POSTs:

  alone  — the quiet tenant: 1 client, search_content (lexical, limit 10), for --seconds (after an
           unmeasured warm-up);
  noisy  — the same quiet client while the noisy tenant's --noisy-clients clients loop over heavy calls:
           search_content limit 100 with queries of ~1,000 characters, answer with max_tokens 4,096
           (abstractive with --chat-model, else extractive) and find_similar of a 20,000-character text;
           the quiet client starts after a warm-up, once every noisy client is busy.

Reports both p50/p95, the ratio of the p95s (the goal: <= 2), and what the noisy tenant got: calls
answered, refused with 429 (its slots full: kdbl_api.fair_share) and failed otherwise.
--noisy-max-in-flight sets the noisy tenant's concurrency (kdbl-control tenant update --max-in-flight):
a large value with KDBL_DB_POOL_SIZE raised shows the neighbour without fair share.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from kdbl_control import admin
from kdbl_control.beir import ensure_indexed, iter_corpus, load_queries, materialise_beir
from kdbl_control.bench import pct, start_api, stop_api
from kdbl_control.loadgen import Connection, encode_post, run_clients
from kdbl_control.up import free_port
from kdbl_core.access.policy import ALL_TOOLS
from kdbl_core.db.connect import sync_pool

QUIET, NOISY = "bench-quiet", "bench-noisy"
QUIET_LIMIT = 10
LONG_QUERY_CHARS = 1000  # KDBL_MAX_QUERY_CHARS' default: the longest query a tenant may send
SIMILAR_TEXT_CHARS = 20_000  # find_similar's text bound
WARMUP_S = 2.0


def _post(url: str, token: str, i: int, name: str, arguments: dict[str, Any]) -> bytes:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    body = json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call",
                       "params": {"name": name, "arguments": arguments}}).encode()
    return encode_post(url, body, headers)


def long_queries(queries: list[str], n: int, chars: int = LONG_QUERY_CHARS) -> list[str]:
    """`n` queries of about `chars` characters, each several of `queries` joined (rotating)."""
    out = []
    for i in range(n):
        parts, k = [], i
        while sum(len(p) + 1 for p in parts) < chars:
            parts.append(queries[k % len(queries)])
            k += 1
        out.append(" ".join(parts)[:chars].rstrip())
    return out


def similar_text(dataset: Path, chars: int = SIMILAR_TEXT_CHARS) -> str:
    """The corpus' first documents joined, cut at `chars` characters."""
    parts: list[str] = []
    for doc in iter_corpus(dataset):
        parts.append(f"{doc.get('title', '')} {doc.get('text', '')}".strip())
        if sum(len(p) + 1 for p in parts) >= chars:
            break
    return " ".join(parts)[:chars]


def noisy_requests(url: str, token: str, queries: list[str], text: str, *, abstractive: bool) -> list[bytes]:
    """The noisy tenant's loop: a long search, an answer and a find_similar per query, interleaved."""
    out = []
    for i, query in enumerate(long_queries(queries, max(3, len(queries) // 3))):
        out.append(_post(url, token, 3 * i, "search_content", {"query": query, "mode": "lexical", "limit": 100}))
        out.append(_post(url, token, 3 * i + 1, "answer", {
            "question": query, "max_tokens": 4096, "answer_type": "abstractive" if abstractive else "extractive"}))
        out.append(_post(url, token, 3 * i + 2, "find_similar", {"subject": {"kind": "text", "text": text},
                                                                  "limit": 100}))
    return out


class Tally:
    """Latencies of answered calls; counts of 429s and other failures (a few samples of each)."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.refused = 0
        self.errors = 0
        self.samples: list[str] = []

    def record(self, ms: float, status: int | None, error: str | None) -> None:
        if status == 429:
            self.refused += 1
            return
        if error is not None:
            self.errors += 1
            if len(self.samples) < 5:
                self.samples.append(error)
            return
        self.latencies_ms.append(ms)

    def summary(self) -> dict[str, Any]:
        times = self.latencies_ms
        return {"answered": len(times), "refused_429": self.refused, "errors": self.errors,
                "p50_ms": pct(times, 0.5) if times else None, "p95_ms": pct(times, 0.95) if times else None,
                "error_samples": self.samples}


async def clients(url: str, requests: list[bytes], *, n: int, seconds: float, tally: Tally) -> None:
    """`n` keep-alive connections sending `requests` round-robin for `seconds`, each call in `tally`."""
    await run_clients(url, requests, clients=n, seconds=seconds, record=tally.record)


async def measure(url: str, quiet: list[bytes], noisy: list[bytes], *, seconds: float, noisy_clients: int,
                  warmup_s: float = WARMUP_S) -> dict[str, Any]:
    conn = Connection(url)
    try:
        await conn.post(noisy[0])  # the noisy token's verification cached
    finally:
        await conn.close()
    await clients(url, quiet, n=1, seconds=warmup_s, tally=Tally())  # unmeasured: caches, plans, connections
    alone = Tally()
    await clients(url, quiet, n=1, seconds=seconds, tally=alone)
    beside, neighbour = Tally(), Tally()

    async def quiet_after_warmup() -> None:
        await asyncio.sleep(warmup_s)  # every noisy client has a call in flight by then
        await clients(url, quiet, n=1, seconds=seconds, tally=beside)

    started = time.monotonic()
    await asyncio.gather(clients(url, noisy, n=noisy_clients, seconds=seconds + warmup_s, tally=neighbour),
                         quiet_after_warmup())
    elapsed = time.monotonic() - started
    out = {"alone": alone.summary(), "with_noisy_neighbour": beside.summary(),
           "noisy": {**neighbour.summary(), "clients": noisy_clients,
                     "answered_per_s": round(len(neighbour.latencies_ms) / elapsed, 2)}}
    a, b = out["alone"]["p95_ms"], out["with_noisy_neighbour"]["p95_ms"]
    out["p95_ratio"] = round(b / a, 2) if a and b else None
    out["goal_met"] = out["p95_ratio"] is not None and out["p95_ratio"] <= 2.0
    return out


def run_fairness_bench(owner_url: str, dataset: Path, work_dir: Path, *, seconds: float = 20.0,
                       noisy_clients: int = 8, n_queries: int = 100, noisy_max_in_flight: int | None = None,
                       chat_model: Path | None = None, quiet_tenant: str = QUIET,
                       noisy_tenant: str = NOISY) -> dict[str, Any]:
    queries = load_queries(dataset, n_queries)
    docs = work_dir / "bench-docs"
    materialise_beir(dataset, docs)
    quiet = ensure_indexed(owner_url, docs, quiet_tenant)
    noisy = ensure_indexed(owner_url, docs, noisy_tenant)
    with sync_pool(owner_url, size=1) as db:
        for name in (quiet_tenant, noisy_tenant):
            admin.update_tenant(db, name, tools=",".join(ALL_TOOLS), force=True)
        admin.update_tenant(db, noisy_tenant, max_in_flight=str(noisy_max_in_flight or "default"), force=True)
    port = free_port()
    env = {"KDBL_SEARCH_CACHE_BYTES": "0"}  # every repeated query pays its search
    if chat_model is not None:
        env["KDBL_CHAT_MODEL_PATH"] = str(chat_model)
    api = start_api(owner_url, port, env)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        result = asyncio.run(measure(
            url, [_post(url, quiet["token"], i, "search_content", {"query": q, "mode": "lexical", "limit": QUIET_LIMIT})
                  for i, q in enumerate(queries)],
            noisy_requests(url, noisy["token"], queries, similar_text(dataset), abstractive=chat_model is not None),
            seconds=seconds, noisy_clients=noisy_clients))
    finally:
        stop_api(api)
    return {"dataset": str(dataset), "chunks_per_tenant": quiet["chunks"], "seconds": seconds,
            "noisy_max_in_flight": noisy_max_in_flight or "default", "abstractive": chat_model is not None,
            **result, "date": time.strftime("%Y-%m-%d %H:%M")}


def summarise(result: dict[str, Any]) -> str:
    alone, beside, noisy = result["alone"], result["with_noisy_neighbour"], result["noisy"]
    return "\n".join([
        f"fairness: quiet search_content (lexical, limit {QUIET_LIMIT}) beside {noisy['clients']} noisy clients, "
        f"{result['chunks_per_tenant']} chunks per tenant, {result['seconds']} s a phase",
        f"  alone:           p50 {alone['p50_ms']} ms  p95 {alone['p95_ms']} ms  ({alone['answered']} calls, "
        f"{alone['errors']} errors)",
        f"  noisy neighbour: p50 {beside['p50_ms']} ms  p95 {beside['p95_ms']} ms  ({beside['answered']} calls, "
        f"{beside['refused_429']} refused, {beside['errors']} errors)",
        f"  p95 ratio {result['p95_ratio']} (goal <= 2: {'met' if result['goal_met'] else 'NOT met'})",
        f"  noisy tenant (max in flight {result['noisy_max_in_flight']}): {noisy['answered']} answered "
        f"({noisy['answered_per_s']}/s), {noisy['refused_429']} refused 429, {noisy['errors']} errors",
    ])
