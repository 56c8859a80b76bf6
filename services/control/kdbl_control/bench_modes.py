"""`kdbl-control bench search --response-modes`: what each search_content response mode costs an agent.

For the classic hit (no response_mode) and each mode (ids_only, metadata, preview, full), one client
sends the same queries (limit 10, modes interleaved per query, the result cache off) through the whole
HTTP path of a `kdbl-api` process and reports
latency (p50/p95), the HTTP response bytes per call, and the hits' tokens per 10 hits: the compact
JSON of structuredContent's `hits`, counted with the embedding model's own tokenizer through llama.cpp
(kdbl_core.embedder, WordPiece; nothing fetched) — guidance for agent and prompt authors, printed in
docs/clients.md. GPT-style BPE tokenizers count JSON differently; the ratios between modes hold better
than the absolute numbers.

The corpus is a BEIR folder (corpus.jsonl + queries.jsonl: its queries) or any folder of documents
(queries: one per line from --queries-file, else the folder's Markdown headings, in path order).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kdbl_control.beir import ensure_indexed, load_queries, materialise_beir
from kdbl_control.bench import pct, start_api, stop_api
from kdbl_control.loadgen import Connection, encode_post
from kdbl_control.up import free_port

MODES: tuple[str | None, ...] = (None, "ids_only", "metadata", "preview", "full")
LIMIT = 10
TENANT = "bench-modes"


def heading_queries(folder: Path, limit: int) -> list[str]:
    """The folder's distinct Markdown headings (3-80 characters), in path order: queries written in the
    corpus's own words, without a judged query set."""
    seen: dict[str, None] = {}
    for path in sorted(folder.rglob("*.md")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("#"):
                text = line.lstrip("#").strip().strip("`*_ ")
                if 3 <= len(text) <= 80:
                    seen.setdefault(text, None)
                    if len(seen) >= limit:
                        return list(seen)
    return list(seen)


def _structured(body: bytes) -> dict[str, Any]:
    """structuredContent of a tools/call answer sent as JSON or as one SSE event."""
    if not body.lstrip().startswith(b"{"):
        body = next(line[5:] for line in body.splitlines() if line.startswith(b"data:"))
    message = json.loads(body)
    if "error" in message:
        raise RuntimeError(f"search_content failed: {message['error']}")
    return message["result"]["structuredContent"]


async def _modes(url: str, token: str, queries: list[str], search_mode: str,
                 count_tokens: Callable[[str], int] | None) -> list[dict[str, Any]]:
    """Each query in every mode in turn (interleaved: drift on a shared machine hits all modes alike)."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    conn = Connection(url)
    times: dict[str | None, list[float]] = {m: [] for m in MODES}
    sizes: dict[str | None, list[int]] = {m: [] for m in MODES}
    tokens: dict[str | None, list[float]] = {m: [] for m in MODES}
    hits_seen = dict.fromkeys(MODES, 0)
    try:
        for i, query in enumerate(queries):
            for response_mode in MODES:
                arguments: dict[str, Any] = {"query": query, "mode": search_mode, "limit": LIMIT}
                if response_mode is not None:
                    arguments["response_mode"] = response_mode
                request = encode_post(url, json.dumps({"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {
                    "name": "search_content", "arguments": arguments}}).encode(), headers)
                if i == 0:
                    await conn.post(request)  # warm the connection, the token cache and each mode's statements
                start = time.perf_counter()
                status, body = await conn.post(request)
                times[response_mode].append((time.perf_counter() - start) * 1000)
                if status != 200:
                    raise RuntimeError(f"search_content answered HTTP {status}")
                sizes[response_mode].append(len(body))
                hits = _structured(body)["hits"]
                hits_seen[response_mode] += len(hits)
                if count_tokens is not None and hits:
                    compact = json.dumps(hits, ensure_ascii=False, separators=(",", ":"))
                    tokens[response_mode].append(count_tokens(compact) * LIMIT / len(hits))
    finally:
        await conn.close()
    out = []
    for m in MODES:
        row: dict[str, Any] = {"response_mode": m or "(default)", "p50_ms": pct(times[m], 0.5),
                               "p95_ms": pct(times[m], 0.95), "bytes_per_call": round(sum(sizes[m]) / len(sizes[m])),
                               "hits_per_call": round(hits_seen[m] / len(queries), 1)}
        if tokens[m]:
            row["tokens_per_10_hits"] = round(sum(tokens[m]) / len(tokens[m]))
        out.append(row)
    return out


def run_modes_bench(owner_url: str, corpus: Path, work_dir: Path, *, n_queries: int, search_mode: str = "lexical",
                    queries_file: Path | None = None, model_path: Path | None = None) -> dict[str, Any]:
    if (corpus / "corpus.jsonl").exists():
        docs = work_dir / "bench-docs"
        materialise_beir(corpus, docs)
        queries = load_queries(corpus, n_queries)
    else:
        docs = corpus
        queries = ([q.strip() for q in queries_file.read_text().splitlines() if q.strip()][:n_queries]
                   if queries_file else heading_queries(corpus, n_queries))
    if not queries:
        raise RuntimeError(f"no queries for {corpus}: pass --queries-file")
    indexed = ensure_indexed(owner_url, docs, f"{TENANT}-{corpus.name}")
    count_tokens = None
    if model_path is not None:
        from kdbl_core.embedder import Embedder

        count_tokens = Embedder(model_path).count_tokens
    port = free_port()
    api = start_api(owner_url, port, {"KDBL_SEARCH_CACHE_BYTES": "0"})  # every call pays its search
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        modes = asyncio.run(_modes(url, indexed["token"], queries, search_mode, count_tokens))
    finally:
        stop_api(api)
    return {"corpus": str(corpus), "search_mode": search_mode, "chunks": indexed["chunks"], "queries": len(queries),
            "limit": LIMIT, "tokenizer": Path(model_path).name if model_path else None, "modes": modes,
            "date": time.strftime("%Y-%m-%d")}


def summarise(result: dict[str, Any]) -> str:
    lines = [f"{result['corpus']}: {result['chunks']} chunks, {result['queries']} queries, "
             f"{result['search_mode']}, limit {result['limit']}, tokens by {result['tokenizer']}",
             f"{'response_mode':14} {'p50 ms':>8} {'p95 ms':>8} {'bytes/call':>11} {'tokens/10 hits':>15}"]
    for m in result["modes"]:
        lines.append(f"{m['response_mode']:14} {m['p50_ms']!s:>8} {m['p95_ms']!s:>8} {m['bytes_per_call']!s:>11} "
                     f"{m.get('tokens_per_10_hits', '-')!s:>15}")
    return "\n".join(lines)
