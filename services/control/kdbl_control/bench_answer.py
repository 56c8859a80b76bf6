"""`kdbl-control bench answer`: the `answer` tool's latency through the whole HTTP path of a `kdbl-api` process.

Corpus: a SciFact-like slice of a BEIR folder — the abstracts the first --queries judged claims cite plus the
first --docs others (SciFact has 5,183; a slice indexes in seconds and keeps the claims answerable). One
client sends raw JSON-RPC tools/call POSTs:
  extractive — each claim as the question (lexical-only tenant: no embedding model), default max_tokens:
               p50/p95 at the client, the server's took_ms by part, and how often an answer was found
               and how often it cites one of the claim's judged abstracts;
  abstractive — with --chat-model, the first 5 claims extractive found an answer to (the others are
               answered "not found" without the model), max_tokens --max-tokens: tokens per second of
               generation (the result's tokens over took_ms.generate) and the call's latency.
The numbers go into docs/benchmarks.md ("Answers").
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import httpx

from kdbl_control import admin
from kdbl_control.beir import doc_file_name, doc_id_of_key, doc_text, ensure_indexed, iter_corpus, load_qrels
from kdbl_control.beir import load_query_map
from kdbl_control.bench import pct, start_api, stop_api
from kdbl_control.up import free_port
from kdbl_core.db.connect import sync_pool

TENANT = "bench-answer"
SIX = ("search_content", "get_file_text", "get_file_window", "get_file_metadata", "list_sources", "list_files")


def slice_corpus(dataset: Path, out: Path, *, n_queries: int, n_docs: int, split: str) -> list[tuple[str, set[str]]]:
    """Writes the slice's documents under `out`; returns the (question, judged doc ids) pairs."""
    qrels, queries = load_qrels(dataset, split), load_query_map(dataset)
    pairs = [(queries[q], set(docs)) for q, docs in qrels.items() if q in queries][:n_queries]
    wanted = set().union(*(docs for _, docs in pairs))
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    others = 0
    for doc in iter_corpus(dataset):
        doc_id = str(doc["_id"])
        if doc_id not in wanted:
            if others >= n_docs:
                continue
            others += 1
        (out / doc_file_name(doc_id)).write_text(doc_text(doc), encoding="utf-8")
    return pairs


def _call(http: httpx.Client, url: str, token: str, i: int, arguments: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = http.post(url, headers={"Authorization": f"Bearer {token}",
                                       "Accept": "application/json, text/event-stream"},
                         json={"jsonrpc": "2.0", "id": i, "method": "tools/call",
                               "params": {"name": "answer", "arguments": arguments}})
    seconds = time.perf_counter() - started
    message = response.json()
    if "error" in message:
        raise RuntimeError(f"answer failed: {message['error']}")
    return seconds * 1000, message["result"]["structuredContent"]


def run_answer_bench(owner_url: str, dataset: Path, work_dir: Path, *, n_queries: int, n_docs: int,
                     split: str = "train", chat_model: Path | None = None, n_abstractive: int = 5,
                     max_tokens: int = 128) -> dict[str, Any]:
    pairs = slice_corpus(dataset, work_dir / "answer-docs", n_queries=n_queries, n_docs=n_docs, split=split)
    indexed = ensure_indexed(owner_url, work_dir / "answer-docs", TENANT)
    with sync_pool(owner_url, size=1) as db:  # lexical only: extractive answers need no embedding model
        admin.update_tenant(db, TENANT, tools=",".join((*SIX, "answer")), modes="lexical")
    port = free_port()
    env = {"KDBL_CHAT_MODEL_PATH": str(chat_model)} if chat_model else {}
    api = start_api(owner_url, port, env)
    url = f"http://127.0.0.1:{port}/mcp"
    result: dict[str, Any] = {"dataset": str(dataset), "documents": indexed["files_with_chunks"],
                              "chunks": indexed["chunks"], "questions": len(pairs)}
    try:
        with httpx.Client(timeout=600) as http:
            _call(http, url, indexed["token"], 0, {"question": pairs[0][0]})  # warm-up (connections, caches)
            times, parts, found, cites_judged, answered = [], [], 0, 0, []
            for i, (question, judged) in enumerate(pairs, 1):
                ms, out = _call(http, url, indexed["token"], i, {"question": question})
                times.append(ms)
                parts.append(out["meta"]["took_ms"])
                found += out["found"]
                if out["found"]:
                    answered.append(question)
                cites_judged += any(doc_id_of_key(c["key"]) in judged for c in out["citations"])
            result["extractive"] = {
                "p50_ms": round(pct(times, 0.5), 2), "p95_ms": round(pct(times, 0.95), 2), "found": found,
                "cites_a_judged_abstract": cites_judged,
                "server_p50_ms": {k: round(pct([p.get(k, 0.0) for p in parts], 0.5), 2)
                                  for k in ("auth", "keyword", "windows", "sentences", "total")}}
            if chat_model:
                rates, decode, firsts, calls, reasons = [], [], [], [], []
                for i, question in enumerate(answered[:n_abstractive], 1000):
                    ms, out = _call(http, url, indexed["token"], i, {"question": question, "answer_type": "abstractive",
                                                                     "max_tokens": max_tokens})
                    calls.append(ms)
                    reasons.append(out["finish_reason"] if out["found"] else "not found")
                    took = out["meta"]["took_ms"]
                    if "first_token" in took:
                        firsts.append(took["first_token"])
                    generate, first = took.get("generate"), took.get("first_token")
                    if generate and out["tokens"]:
                        rates.append(out["tokens"] / (generate / 1000))
                        if first is not None and out["tokens"] > 1 and generate > first:
                            decode.append((out["tokens"] - 1) / ((generate - first) / 1000))
                result["abstractive"] = {"model": chat_model.name, "max_tokens": max_tokens, "calls": len(calls),
                                         "generated": len(rates), "finish_reasons": reasons,
                                         "tokens_per_s_p50": round(pct(rates, 0.5), 1) if rates else None,
                                         "decode_tokens_per_s_p50": round(pct(decode, 0.5), 1) if decode else None,
                                         "first_token_ms_p50": round(pct(firsts, 0.5), 1) if firsts else None,
                                         "call_p50_ms": round(pct(calls, 0.5), 1)}
    finally:
        stop_api(api)
    result["date"] = time.strftime("%Y-%m-%d")
    return result


def summarise(result: dict[str, Any]) -> str:
    ex = result["extractive"]
    lines = [f"answer: {result['questions']} questions, {result['documents']} documents, {result['chunks']} chunks",
             f"  extractive: p50 {ex['p50_ms']} ms  p95 {ex['p95_ms']} ms  found {ex['found']}/{result['questions']}  "
             f"cites a judged abstract {ex['cites_a_judged_abstract']}/{result['questions']}",
             f"  server p50 by part (ms): {json.dumps(ex['server_p50_ms'])}"]
    ab = result.get("abstractive")
    if ab:
        lines.append(f"  abstractive ({ab['model']}, max_tokens {ab['max_tokens']}): {ab['tokens_per_s_p50']} "
                     f"tokens/s p50 (prompt included; decode alone {ab['decode_tokens_per_s_p50']}, first token "
                     f"p50 {ab['first_token_ms_p50']} ms), call p50 {ab['call_p50_ms']} ms over {ab['calls']} calls "
                     f"({ab['generated']} generated; {', '.join(ab['finish_reasons'])})")
    return "\n".join(lines)
