"""`kdbl-control bench similar`: find_similar's recall on a BEIR data set with multi-document judgements.

SciFact's claims cite one to several abstracts; for every claim citing two or more, each cited abstract in
turn is the subject (find_similar, kind file, by files, limit 10) and the measure is how many of the
claim's OTHER cited abstracts come back in the top 10 (recall@10, averaged over subjects), and how often
at least one does (hit@10). Both methods run through the whole HTTP path of a `kdbl-api` process: vector
(the stored embeddings, tenant policy lexical+hybrid) and lexical (more-like-this, the tenant switched to
lexical only). Beside them, in the same run, the exact reference for the vector method's idea: each
file's mean chunk vector against every other file's, brute force in numpy (no HNSW, no chunk grouping).
Latency p50/p95 per method, one client.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg

from kdbl_control import admin
from kdbl_control.beir import doc_file_name, doc_id_of_key, ensure_indexed, load_qrels, materialise_beir
from kdbl_control.bench import pct, start_api, stop_api
from kdbl_control.evaluate import embed_chunks
from kdbl_control.up import free_port
from kdbl_core.content.uris import file_uri
from kdbl_core.db.connect import conninfo, sync_pool
from kdbl_core.embedder import Embedder

TENANT = "bench-similar"
K = 10


def claims(dataset: Path, split: str) -> list[list[str]]:
    """The cited documents of each claim that cites two or more."""
    return [sorted(docs) for docs in load_qrels(dataset, split).values() if len(docs) >= 2]


def _recall(found: list[str], subject: str, cited: list[str]) -> tuple[float, bool]:
    others = [d for d in cited if d != subject]
    got = sum(1 for d in others if d in found[:K])
    return got / len(others), got > 0


def _file_means(owner_url: str, tenant_id: Any) -> tuple[list[str], np.ndarray]:
    with psycopg.connect(conninfo(owner_url)) as conn:
        rows = conn.execute("""
            SELECT f.key, CAST(avg(c.embedding) AS text) AS v FROM chunks c JOIN files f ON f.id = c.file_id
             WHERE c.tenant_id = %(t)s AND c.embedding IS NOT NULL GROUP BY f.key""", {"t": tenant_id}).fetchall()
    keys = [doc_id_of_key(r[0]) for r in rows]
    vectors = np.array([json.loads(r[1]) for r in rows], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return keys, vectors


def _exact_dense(keys: list[str], vectors: np.ndarray, groups: list[list[str]]) -> dict[str, float]:
    index = {k: i for i, k in enumerate(keys)}
    recalls, hits = [], []
    for cited in groups:
        for subject in cited:
            if subject not in index:
                continue
            sims = vectors @ vectors[index[subject]]
            sims[index[subject]] = -2.0
            top = [keys[i] for i in np.argsort(-sims)[:K]]
            recall, hit = _recall(top, subject, cited)
            recalls.append(recall)
            hits.append(hit)
    return {"subjects": len(recalls), "recall_at_10": round(float(np.mean(recalls)), 4),
            "hit_at_10": round(float(np.mean(hits)), 4)}


def _run_method(url: str, token: str, source_id: Any, groups: list[list[str]], method: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    recalls, hits, times, methods = [], [], [], set()
    with httpx.Client(timeout=60, headers=headers) as client:
        for n, cited in enumerate(groups):
            for subject in cited:
                body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "find_similar", "arguments": {
                    "subject": {"kind": "file", "id": file_uri(source_id, doc_file_name(subject))},
                    "by": "files", "limit": K}}}
                start = time.perf_counter()
                answer = client.post(url, json=body).json()
                times.append((time.perf_counter() - start) * 1000)
                if "error" in answer:  # a cited document the corpus lacks, or one that failed to index
                    continue
                result = answer["result"]["structuredContent"]
                methods.add(result["method"])
                recall, hit = _recall([doc_id_of_key(h["key"]) for h in result["hits"]], subject, cited)
                recalls.append(recall)
                hits.append(hit)
    if methods != {method}:
        raise RuntimeError(f"find_similar ran {sorted(methods)}, expected {method}")
    return {"subjects": len(recalls), "recall_at_10": round(float(np.mean(recalls)), 4),
            "hit_at_10": round(float(np.mean(hits)), 4), "p50_ms": pct(times, 0.5), "p95_ms": pct(times, 0.95)}


@contextmanager
def _api(owner_url: str, env: dict[str, str]) -> Iterator[str]:
    port = free_port()
    api = start_api(owner_url, port, env)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        stop_api(api)


def run_similar_bench(owner_url: str, dataset: Path, work_dir: Path, model_path: Path, *,
                      split: str = "train", terms: tuple[int, ...] = (25,)) -> dict[str, Any]:
    """`terms`: KDBL_SIMILAR_TERMS values the lexical method runs with (an API process each); the first
    is reported as `lexical`, all of them under `lexical_by_terms`."""
    docs = work_dir / "bench-docs"
    n_docs = materialise_beir(dataset, docs)
    indexed = ensure_indexed(owner_url, docs, TENANT)
    embedder = Embedder(model_path, n_threads=os.cpu_count() or 2)
    embedding = embed_chunks(owner_url, indexed["tenant_id"], embedder, 32, lambda line: print(line, file=sys.stderr))
    del embedder
    groups = claims(dataset, split)
    with sync_pool(owner_url, size=1) as db:
        admin.update_tenant(db, TENANT, tools="search_content,find_similar", modes="lexical,hybrid", force=True)
    by_terms: dict[int, dict[str, Any]] = {}
    try:
        with _api(owner_url, {"KDBL_EMBED_MODEL_PATH": str(model_path)}) as url:
            vector = _run_method(url, indexed["token"], indexed["source_id"], groups, "vector")
        with sync_pool(owner_url, size=1) as db:
            admin.update_tenant(db, TENANT, modes="lexical", force=True)
        for k in terms:
            with _api(owner_url, {"KDBL_SIMILAR_TERMS": str(k)}) as url:
                by_terms[k] = _run_method(url, indexed["token"], indexed["source_id"], groups, "lexical")
    finally:
        with sync_pool(owner_url, size=1) as db:
            admin.update_tenant(db, TENANT, modes="lexical,hybrid", force=True)
    lexical = by_terms[terms[0]]
    keys, vectors = _file_means(owner_url, indexed["tenant_id"])
    return {"dataset": str(dataset), "split": split, "documents": n_docs, "chunks": indexed["chunks"],
            "claims": len(groups), "embedding": embedding,
            "vector": vector, "lexical": lexical, "lexical_by_terms": by_terms,
            "exact_dense_file_means": _exact_dense(keys, vectors, groups),
            "random_recall_at_10": round(K / max(1, n_docs - 1), 5),
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "date": time.strftime("%Y-%m-%d")}


def summarise(result: dict[str, Any]) -> str:
    lines = [f"{result['documents']} documents, {result['chunks']} chunks; {result['claims']} claims citing 2+ "
             f"({result['split']})", f"{'':34} {'subjects':>8} {'recall@10':>9} {'hit@10':>7} {'p50 ms':>7} {'p95 ms':>7}"]
    for name, key in (("find_similar vector (HTTP)", "vector"), ("find_similar lexical MLT (HTTP)", "lexical"),
                      ("exact dense, file means (numpy)", "exact_dense_file_means")):
        r = result[key]
        lines.append(f"{name:34} {r['subjects']:>8} {r['recall_at_10']:>9} {r['hit_at_10']:>7} "
                     f"{r.get('p50_ms', ''):>7} {r.get('p95_ms', ''):>7}")
    for k, r in result["lexical_by_terms"].items():
        lines.append(f"{'lexical MLT, ' + str(k) + ' terms':34} {r['subjects']:>8} {r['recall_at_10']:>9} "
                     f"{r['hit_at_10']:>7} {r['p50_ms']:>7} {r['p95_ms']:>7}")
    lines.append(f"random: recall@10 {result['random_recall_at_10']}")
    return "\n".join(lines)
