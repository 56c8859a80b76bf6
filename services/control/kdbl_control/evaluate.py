"""`kdbl-control eval`: retrieval quality of search_content on a BEIR data set, beside reference systems.

The corpus is indexed through the real crawl pipeline into a tenant of its own (one text file per
document: title, blank line, text; see kdbl_control.beir), chunk embeddings are filled in by the worker's
own code when a model is given, and every judged query runs through the search plan the MCP tool runs
(`kdbl_core.search.plan.SearchPlan`, inside an RLS transaction as the kdbl_api role). Chunk hits
become a document ranking (document id = file key without ".txt", first occurrence wins) and are scored
with kdbl_control.ir_metrics (BEIR / trec_eval conventions).

References, measured in the same run over the same documents:
  bm25s        — bm25s (Lucene BM25, k1=1.5, b=0.75) over title + text of whole documents, English
                 stop words, Snowball English stemmer (PyStemmer) when installed;
  dense_exact  — exact cosine search in numpy over the chunk embeddings stored in the database,
                 document score = max over its chunks; queries embedded by the same model.

Caveat: search_content returns at most `limit` (<= 100) *chunks*, so our modes rank fewer than 100
documents per query (docs_per_query says how many); the references rank up to `limit` documents.
recall@100 therefore favours the references slightly; nDCG@10, recall@10 and MRR@10 do not care.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdbl_control import ir_metrics
from kdbl_control.beir import (doc_id_of_key, doc_text, ensure_indexed, iter_corpus, load_qrels,
                               load_query_map, materialise_beir)
from kdbl_core.errors import ConfigError, KdblError
from kdbl_core.settings import Settings, get_settings

MODES = ("lexical", "semantic", "hybrid")
MEASURES = ("ndcg@10", "recall@10", "recall@100", "mrr@10")
DEFAULT_MODEL_NAME = "all-minilm-l6-v2.f16.gguf"
BM25S_PARAMS = {"k1": 1.5, "b": 0.75, "method": "lucene"}

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- defaults


def default_model_path(settings: Settings | None = None) -> Path | None:
    """KDBL_EMBED_MODEL_PATH when set, else the cached default GGUF (airgap/model/build_model.py), if any."""
    settings = settings or get_settings()
    if settings.embed_model_path:
        return Path(settings.embed_model_path).expanduser()
    cached = settings.model_dir / DEFAULT_MODEL_NAME
    return cached if cached.is_file() else None


def _slug(value: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", value.lower()).strip("-")[:24] or "data"


def scratch_names(dataset: Path, work_dir: Path) -> tuple[Path, str]:
    """Where the documents go and the tenant they are indexed into, stable per (dataset, work dir)."""
    digest = hashlib.sha256(f"{dataset.resolve()}\0{work_dir.resolve()}".encode()).hexdigest()[:10]
    slug = _slug(dataset.resolve().name)
    return work_dir / "eval-docs" / f"{slug}-{digest}", f"eval-{slug}-{digest}"


# --------------------------------------------------------------------------- our modes


def _mode_unavailable(reason: str) -> dict[str, Any]:
    return {"unavailable": reason}


async def _search_runs(owner_url: str, tenant_id: Any, tenant: str, queries: list[tuple[str, str]],
                       modes: Sequence[str], embedder: Any, no_vector_reason: str, limit: int,
                       settings: Settings, log: Log) -> dict[str, dict[str, Any]]:
    """Run every query through the search pipeline (search_content's) per mode;
    {mode: {"run", "latencies", ...} | unavailable}."""
    from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
    from kdbl_core.db.connect import async_pool
    from kdbl_core.db.urls import for_role
    from kdbl_core.search import pipeline
    from kdbl_core.search.plan import SearchPlan

    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=2, name="kdbl-eval")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:eval",
                          scopes=frozenset(ALL_SCOPES))
    out: dict[str, dict[str, Any]] = {}
    try:
        for mode in modes:
            if mode in ("semantic", "hybrid") and embedder is None:
                out[mode] = _mode_unavailable(no_vector_reason)
                continue

            async def one(query: str, mode: str = mode) -> tuple[list[str], float, str, str | None]:
                pipeline.check_query(query, settings)
                request = pipeline.SearchRequest(query=query, mode=mode, limit=limit)
                start = time.perf_counter()
                async with rls_transaction(pool, principal) as conn:
                    result = await SearchPlan(request, settings=settings, embedder=embedder).run(conn)
                elapsed = (time.perf_counter() - start) * 1000
                ranking = ir_metrics.dedupe(doc_id_of_key(hit["key"]) for hit in result.hits)
                return ranking, elapsed, result.mode, result.degraded_reason

            await one(queries[0][1])  # warm the pool, prepared statements, caches of the server
            run: dict[str, list[str]] = {}
            latencies: list[float] = []
            served: dict[str, int] = {}
            degraded: set[str] = set()
            errors: list[str] = []
            started = time.monotonic()
            for i, (qid, query) in enumerate(queries, 1):
                try:
                    ranking, elapsed, served_as, reason = await one(query)
                except KdblError as exc:
                    errors.append(f"{qid}: {exc}")
                    run[qid] = []
                    continue
                run[qid] = ranking
                latencies.append(elapsed)
                served[served_as] = served.get(served_as, 0) + 1
                if reason:
                    degraded.add(reason)
                if i % 200 == 0:
                    log(f"eval: {mode}: {i}/{len(queries)} queries, {time.monotonic() - started:.0f} s")
            out[mode] = {"run": run, "latencies": latencies, "served": served, "errors": errors,
                         "degraded_reasons": sorted(degraded)}
    finally:
        await pool.close()
    return out


def embed_chunks(owner_url: str, tenant_id: Any, embedder: Any, batch: int, log: Log) -> dict[str, Any]:
    """Fill missing chunk embeddings of a tenant with the worker's own code, logging progress."""
    from kdbl_control.compose import embed_pending
    from kdbl_core.db.connect import sync_pool
    from kdbl_core.db.urls import for_role

    worker = sync_pool(for_role(owner_url, "kdbl_worker"), size=1, name="kdbl-eval-embed")
    total, started = 0, time.monotonic()
    try:
        while True:
            done = embed_pending(worker, embedder, tenant_id=tenant_id, batch=batch, max_batches=20)
            if not done:
                break
            total += done
            elapsed = time.monotonic() - started
            log(f"eval: embedded {total} chunks, {total / elapsed:.1f} chunks/s")
    finally:
        worker.close()
    seconds = time.monotonic() - started
    return {"embedded": total, "seconds": round(seconds, 1),
            "chunks_per_s": round(total / seconds, 1) if total and seconds > 0 else None}


# --------------------------------------------------------------------------- references


def _bm25s_reference(dataset: Path, queries: list[tuple[str, str]], limit: int) -> dict[str, Any]:
    try:
        import bm25s
    except ImportError:
        return {"unavailable": "bm25s is not installed (pip install bm25s)"}
    try:
        import Stemmer

        stemmer = Stemmer.Stemmer("english")
        stemmer_name = "PyStemmer Snowball english"
    except ImportError:
        stemmer, stemmer_name = None, "none (PyStemmer not installed)"

    ids, texts = [], []
    for doc in iter_corpus(dataset):
        ids.append(doc["_id"])
        texts.append(doc_text(doc))
    started = time.perf_counter()
    retriever = bm25s.BM25(**BM25S_PARAMS)
    retriever.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False),
                    show_progress=False)
    index_s = time.perf_counter() - started
    k = min(limit, len(ids))
    run: dict[str, list[str]] = {}
    latencies = []
    for qid, query in queries:
        start = time.perf_counter()
        tokens = bm25s.tokenize([query], stopwords="en", stemmer=stemmer, return_ids=False,
                                show_progress=False)
        docs, scores = retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        latencies.append((time.perf_counter() - start) * 1000)
        # bm25s returns k documents even when they share no term with the query: those are not retrieved
        run[qid] = [ids[d] for d, s in zip(docs[0], scores[0], strict=True) if s > 0]
    from importlib.metadata import version

    return {"run": run, "latencies": latencies, "index_s": round(index_s, 2),
            "config": {"package": f"bm25s {version('bm25s')}", **BM25S_PARAMS, "stopwords": "bm25s 'en' list",
                       "stemmer": stemmer_name,
                       "token_pattern": "bm25s default (?u)\\b\\w\\w+\\b, lower-cased",
                       "text": "title + blank line + text, whole document"}}


def _dense_reference(owner_url: str, tenant_id: Any, embedder: Any, queries: list[tuple[str, str]],
                     limit: int) -> dict[str, Any]:
    import numpy as np

    from kdbl_core.db.connect import sync_pool

    with sync_pool(owner_url, size=1, name="kdbl-eval-dense") as owner, owner.connection() as conn:
        rows = conn.execute(
            "SELECT f.key, c.embedding::real[] AS e FROM chunks c JOIN files f ON f.id = c.file_id "
            "WHERE c.tenant_id = %(t)s AND c.embedding IS NOT NULL AND c.embedding_model = %(m)s "
            "ORDER BY f.key, c.seq",
            {"t": tenant_id, "m": embedder.model_id}).fetchall()
    if not rows:
        return {"unavailable": f"no chunk embeddings of {embedder.model_id} in the database"}
    matrix = np.asarray([r.e for r in rows], dtype=np.float32)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    keys = [r.key for r in rows]
    starts = [0] + [i for i in range(1, len(keys)) if keys[i] != keys[i - 1]]  # rows are ordered by key
    doc_ids = [doc_id_of_key(keys[i]) for i in starts]
    starts_arr = np.asarray(starts)
    k = min(limit, len(doc_ids))
    run: dict[str, list[str]] = {}
    latencies = []
    embedder.embed([queries[0][1]])  # warm-up, as the search modes get one
    for qid, query in queries:
        start = time.perf_counter()
        q = np.asarray(embedder.embed([query])[0], dtype=np.float32)
        q /= max(float(np.linalg.norm(q)), 1e-12)
        doc_scores = np.maximum.reduceat(matrix @ q, starts_arr)
        top = np.argpartition(-doc_scores, k - 1)[:k] if k < len(doc_ids) else np.arange(len(doc_ids))
        top = top[np.argsort(-doc_scores[top], kind="stable")]
        latencies.append((time.perf_counter() - start) * 1000)
        run[qid] = [doc_ids[i] for i in top]
    return {"run": run, "latencies": latencies, "config": {
        "chunks": len(rows), "documents": len(doc_ids), "similarity": "cosine (vectors re-normalised)",
        "doc_score": "max over the document's chunks", "search": "exact, numpy float32 matmul"}}


# --------------------------------------------------------------------------- scoring


def _score(run: dict[str, list[str]], latencies: list[float],
           qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    measured = ir_metrics.evaluate(run, qrels, MEASURES)
    out: dict[str, Any] = {m: round(measured[m], 5) for m in MEASURES}
    out["latency_ms"] = ({"p50": round(ir_metrics.percentile(latencies, 50), 2),
                          "p95": round(ir_metrics.percentile(latencies, 95), 2)} if latencies else None)
    out["docs_per_query"] = round(sum(len(r) for r in run.values()) / len(run), 1) if run else 0.0
    return out


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpus": os.cpu_count(), "cpu": cpu, "python": sys.version.split()[0],
                            "platform": platform.platform()}
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
        info["loadavg_1m_at_start"] = round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        pass
    return info


# --------------------------------------------------------------------------- entry point


def run_eval(owner_url: str, dataset: Path, *, split: str = "train", modes: Sequence[str] = MODES,
             model_path: Path | None, work_dir: Path, max_queries: int | None = None, limit: int = 100,
             tenant: str | None = None, references: bool = True, log: Log = _stderr) -> dict[str, Any]:
    """Index `dataset` into a scratch tenant, run its judged queries per mode, score them; JSON-able dict.

    `tenant` overrides the scratch tenant's name (default: derived from dataset and work dir, so a re-run
    over the same database reuses the index and the embeddings). Modes that cannot run without a model
    are reported as {"unavailable": reason}."""
    dataset = dataset.expanduser().resolve()
    modes = _checked_modes(dataset, modes, limit)
    settings = get_settings()
    machine = _machine()
    judged, qrels, without_text = _judged_queries(dataset, split, max_queries)
    work_dir = work_dir.expanduser().resolve()
    docs, default_tenant = scratch_names(dataset, work_dir)
    tenant = tenant or default_tenant
    n_docs, indexed = _index(owner_url, dataset, docs, tenant, log)

    wants_vectors = any(m in ("semantic", "hybrid") for m in modes)
    vectors = _load_vectors(owner_url, indexed["tenant_id"], model_path if wants_vectors else None, settings, log)
    try:
        runs = asyncio.run(_search_runs(owner_url, indexed["tenant_id"], tenant, judged, modes, vectors.usable,
                                        vectors.reason, limit, settings, log))
        refs = _references(owner_url, indexed["tenant_id"], dataset, judged, limit, vectors,
                           wants_vectors=wants_vectors, log=log) if references else {}
    finally:
        if vectors.embedder is not None:
            vectors.embedder.close()

    return {
        "dataset": str(dataset), "split": split, "queries": len(judged), "documents": n_docs,
        "chunks": indexed["chunks"], "documents_with_chunks": indexed["files_with_chunks"],
        "modes": {mode: _scored_mode(mode, runs[mode], qrels) for mode in modes},
        "references": {name: _scored_reference(name, data, qrels) for name, data in refs.items()},
        "machine": machine, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "settings": _run_settings(settings, tenant=tenant, limit=limit, max_queries=max_queries,
                                  without_text=without_text, indexed=indexed, model_path=model_path,
                                  vectors=vectors),
    }


def _checked_modes(dataset: Path, modes: Sequence[str], limit: int) -> list[str]:
    """The modes to run, each once, after checking the dataset folder, the modes and the limit."""
    if not (dataset / "corpus.jsonl").is_file() or not (dataset / "queries.jsonl").is_file():
        raise ConfigError(f"{dataset} is not a BEIR folder (corpus.jsonl and queries.jsonl expected)")
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigError(f"unknown mode(s) {unknown or '(none)'}; choose from {', '.join(MODES)}")
    if not 1 <= limit <= 100:
        raise ConfigError(f"limit must lie in [1, 100] (search_content's maximum), got {limit}")
    return list(dict.fromkeys(modes))


def _judged_queries(dataset: Path, split: str, max_queries: int | None
                    ) -> tuple[list[tuple[str, str]], dict[str, dict[str, int]], int]:
    """The queries with a relevant document in qrels/<split>.tsv (the first `max_queries`), their qrels,
    and how many judged query ids queries.jsonl has no text for."""
    qrels_all = load_qrels(dataset, split)
    query_map = load_query_map(dataset)
    judged = [(qid, text) for qid, text in query_map.items()
              if any(g > 0 for g in qrels_all.get(qid, {}).values())]
    if max_queries is not None:
        judged = judged[:max_queries]
    if not judged:
        raise ConfigError(f"no query in queries.jsonl has a relevant document in qrels/{split}.tsv")
    qrels = {qid: qrels_all[qid] for qid, _ in judged}
    return judged, qrels, len(set(qrels_all) - set(query_map))


def _index(owner_url: str, dataset: Path, docs: Path, tenant: str, log: Log) -> tuple[int, dict[str, Any]]:
    """Write the corpus as documents into `docs` and crawl them into `tenant`: (documents, ensure_indexed's
    report)."""
    log(f"eval: materialising {dataset.name} into {docs}")
    n_docs = materialise_beir(dataset, docs)
    log(f"eval: indexing {n_docs} documents into tenant {tenant}")
    indexed = ensure_indexed(owner_url, docs, tenant, token_name=None)
    log(f"eval: {indexed['chunks']} chunks ({indexed['crawl']})")
    if not indexed["chunks"]:
        raise ConfigError(f"indexing {docs} produced no chunks (crawl: {indexed['crawl']})")
    if indexed["files_with_chunks"] < n_docs:
        log(f"eval: warning: only {indexed['files_with_chunks']} of {n_docs} documents have chunks "
            "(empty documents, or extraction failures: see the crawl stats)")
    return n_docs, indexed


@dataclass
class _Vectors:
    """A run's embedding model (None without a model or a mode that needs one), the report of embedding the
    tenant's chunks with it, and why semantic / hybrid search cannot run when they cannot."""

    embedder: Any = None
    embedding: dict[str, Any] | None = None
    reason: str = "no embedding model (give --model or build the default GGUF)"

    @property
    def usable(self) -> Any:
        """The embedder when the chunks could be embedded, else None."""
        return self.embedder if self.embedding is not None and "unavailable" not in self.embedding else None


def _load_vectors(owner_url: str, tenant_id: Any, model_path: Path | None, settings: Settings, log: Log) -> _Vectors:
    """Load the model at `model_path` (when given) and embed the tenant's chunks that have no embedding."""
    vectors = _Vectors()
    if model_path is None:
        return vectors
    from kdbl_core.embedder import Embedder

    # no query cache: every query pays for its embedding, as a first-seen agent query does
    vectors.embedder = Embedder(model_path, n_threads=settings.embed_threads,
                                max_tokens=settings.embed_max_tokens, query_cache_size=0)
    log(f"eval: embedding model {vectors.embedder.model_id}")
    vectors.embedding = embed_chunks(owner_url, tenant_id, vectors.embedder, settings.embed_batch, log)
    if "unavailable" in vectors.embedding:
        vectors.reason = vectors.embedding["unavailable"]
        log(f"eval: {vectors.reason}")
    return vectors


def _references(owner_url: str, tenant_id: Any, dataset: Path, queries: list[tuple[str, str]], limit: int,
                vectors: _Vectors, *, wants_vectors: bool, log: Log) -> dict[str, Any]:
    """bm25s, and dense_exact when a semantic or hybrid mode runs with a usable model."""
    log("eval: reference bm25s")
    refs: dict[str, Any] = {"bm25s": _bm25s_reference(dataset, queries, limit)}
    if not wants_vectors:
        refs["dense_exact"] = _mode_unavailable("not run: no semantic or hybrid mode requested")
    elif vectors.usable is None:
        refs["dense_exact"] = _mode_unavailable(vectors.reason)
    else:
        log("eval: reference dense_exact")
        refs["dense_exact"] = _dense_reference(owner_url, tenant_id, vectors.embedder, queries, limit)
    return refs


def _scored_mode(mode: str, data: dict[str, Any], qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    """One mode's measures, with the modes it was served as instead (degraded) and its errors."""
    if "unavailable" in data:
        return data
    scored = _score(data["run"], data["latencies"], qrels)
    served = {m: n for m, n in data["served"].items() if m != mode}
    if served:
        scored["served_as"] = served  # e.g. hybrid degraded to lexical
        scored["degraded_reasons"] = data["degraded_reasons"]
    if data["errors"]:
        scored["errors"] = data["errors"][:20]
        scored["error_count"] = len(data["errors"])
    return scored


def _scored_reference(name: str, data: dict[str, Any], qrels: dict[str, dict[str, int]]) -> dict[str, Any]:
    if "unavailable" in data:
        return data
    scored = _score(data["run"], data["latencies"], qrels)
    scored["config"] = data["config"]
    if name == "bm25s":
        scored["index_s"] = data["index_s"]
    else:
        scored["latency_note"] = "query embedding + exact matmul, per query"
    return scored


def _run_settings(settings: Settings, *, tenant: str, limit: int, max_queries: int | None, without_text: int,
                  indexed: dict[str, Any], model_path: Path | None, vectors: _Vectors) -> dict[str, Any]:
    """What the run was measured with: the result's `settings`."""
    from kdbl_core.search import lexical

    return {
        "tenant": tenant, "limit_chunks": limit, "max_queries": max_queries,
        "qrels_queries_without_text": without_text,
        "crawl": indexed["crawl"], "embedding": vectors.embedding,
        "chunking": {"target_chars": settings.chunk_target_chars, "max_chars": settings.chunk_max_chars},
        "lexical": {"bm25": {"k1": lexical.K1, "b": lexical.B}, "ts_config": settings.text_search_config,
                    "unit": "chunk"},
        "model": _model_settings(settings, model_path, vectors.embedder) if model_path else None,
        "hybrid": {name.removeprefix("hybrid_"): value for name, value in settings.model_dump().items()
                   if name.startswith("hybrid_")},
        "ranking": "chunk hits -> documents, first occurrence wins (key minus .txt)",
        "metrics": "BEIR/trec_eval: linear-gain nDCG, log2(rank+1); unjudged queries skipped",
        "latency": "per query, wall clock: RLS transaction + search pipeline (+ query embedding)",
    }


def _model_settings(settings: Settings, model_path: Path, embedder: Any) -> dict[str, Any]:
    return {"path": str(model_path), "id": embedder.model_id if embedder else None,
            "threads": settings.embed_threads, "max_tokens": settings.embed_max_tokens,
            "batch": settings.embed_batch, "query_cache": "off"}


# --------------------------------------------------------------------------- output


def summarise(result: dict[str, Any]) -> str:
    title = (f"{Path(result['dataset']).name} ({result['split']}): {result['queries']} queries, "
             f"{result['documents']} documents, {result['chunks']} chunks — {result['date']}, "
             f"{result['machine'].get('cpus')} CPUs")
    lines = [title]
    head = (f"{'system':22}" + "".join(f"{m:>11}" for m in MEASURES)
            + f"{'p50 ms':>9}{'p95 ms':>9}{'docs/q':>8}")
    lines += [head, "-" * len(head)]

    def row(name: str, data: dict[str, Any]) -> str:
        if "unavailable" in data:
            return f"{name:22}  unavailable: {data['unavailable']}"
        lat = data.get("latency_ms") or {}
        text = (f"{name:22}" + "".join(f"{data[m]:>11.4f}" for m in MEASURES)
                + f"{lat.get('p50', float('nan')):>9.1f}{lat.get('p95', float('nan')):>9.1f}"
                + f"{data.get('docs_per_query', 0):>8.1f}")
        if data.get("served_as"):
            text += f"  served as {data['served_as']}"
        if data.get("error_count"):
            text += f"  errors {data['error_count']}"
        return text

    for mode, data in result["modes"].items():
        lines.append(row(mode, data))
    for name, data in result.get("references", {}).items():
        lines.append(row(f"ref: {name}", data))
    emb = (result.get("settings") or {}).get("embedding")
    if emb and "embedded" in emb:
        lines.append(f"embedding: {emb['embedded']} chunks embedded in this run, "
                     f"{emb['chunks_per_s']} chunks/s")
    lines.append("our modes rank at most 100 chunks (docs/q < 100), so recall@100 favours the references")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> Path:
    """A grouped bar chart of the quality measures per system (needs matplotlib, not a dependency)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed in this environment") from None
    systems = [(m, d) for m, d in result["modes"].items() if "unavailable" not in d]
    systems += [(f"ref: {n}", d) for n, d in result.get("references", {}).items() if "unavailable" not in d]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(systems))
    for i, (name, data) in enumerate(systems):
        xs = [j + (i - (len(systems) - 1) / 2) * width for j in range(len(MEASURES))]
        ax.bar(xs, [data[m] for m in MEASURES], width, label=name)
    ax.set_xticks(range(len(MEASURES)), MEASURES)
    ax.set_ylim(0, 1)
    ax.set_title(f"{Path(result['dataset']).name} ({result['split']}, {result['queries']} queries)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def cli_eval(args: Any, settings: Settings) -> int:
    """What `kdbl-control eval` runs: embedded Postgres under the work dir unless KDBL_DATABASE_URL is set
    (and --data-dir is not given). Expects args.dataset, split, mode (list or None), json, max_queries,
    model, work_dir, data_dir, plot, limit (optional), no_references (optional)."""
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    work = Path(args.work_dir or Path(tempfile.gettempdir()) / "kdbl-eval").expanduser().resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or default_model_path(settings)
    if model is not None and not Path(model).is_file():
        raise ConfigError(f"embedding model not found: {model}")
    options = {"split": args.split, "modes": args.mode or list(MODES), "model_path": model, "work_dir": work,
               "max_queries": args.max_queries, "limit": getattr(args, "limit", None) or 100,
               "references": not getattr(args, "no_references", False)}
    if settings.database_url is not None and args.data_dir is None:
        result = run_eval(settings.database_url.get_secret_value(), args.dataset, **options)
    else:
        with EmbeddedDatabase(args.data_dir or work / "db", settings=settings) as db:
            result = run_eval(db.owner_url, args.dataset, **options)
    if getattr(args, "plot", None):
        plot(result, args.plot)
        _stderr(f"eval: plot written to {args.plot}")
    import json

    print(json.dumps(result, indent=2, default=str) if args.json else summarise(result))
    return 0


__all__ = ["MEASURES", "MODES", "cli_eval", "default_model_path", "plot", "run_eval", "summarise"]
