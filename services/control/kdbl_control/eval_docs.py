"""`kdbl-control eval FOLDER --questions FILE`: does one search find the right file, and the right page?

SciFact (kdbl_control.evaluate) judges short abstracts, one per file. Real shares hold long documents —
annual reports, manuals — where an agent needs the file *and* the page, and a chunk from page 60 rarely
says which company or year it belongs to. This eval crawls a folder of real documents through the real
pipeline (fs source, extraction, chunking, the write path) into a tenant of its own and asks each question
once, as written, through the search plan search_content runs (`kdbl_core.search.plan.SearchPlan`,
inside an RLS transaction as the kdbl_api role), with search_content's defaults but the limit (10).

Questions are JSON lines: {"id", "question", "file" (the key of the expected file), "pages" (1-based pages
of that file on which the answer is stated), "answer", "kind" ("table" | "text")}. A `manifest.json`
beside the questions ({"documents": {name: {"sha256": ...}}}) is checked first: a missing or different
document is an error, so two runs compare the same bytes. docs/eval/longdocs/ is the set we ship.

Measures, per mode, overall and per kind and per question group (the id's first part):
  doc_hit@k    a hit among the first k is a chunk of the expected file (k = 1, 5, 10);
  page_hit@k   such a hit's page is one of the expected pages;
  doc_mrr, page_mrr   1 / the rank of the first such hit (0 when none in the limit).

`--embedded-share S` (repeatable, 0 < S < 1) also runs hybrid as it is served while the worker is still
embedding: only the first S of the tenant's chunks by id (the order the worker fills them) keep their
vectors, the others' are set aside for the run (their embedding_model marked `hidden:`, which the vector
arm and the embedded-share counters read as another model) and put back afterwards — also at the start of
every run, should one have been interrupted. `--unanswerable FILE` also judges the `answer` tool
(kdbl_control.eval_answers).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kdbl_control import eval_answers, evaluate
from kdbl_control.beir import ensure_indexed
from kdbl_core.errors import ConfigError, KdblError
from kdbl_core.settings import Settings, get_settings

KS = (1, 5, 10)
DEFAULT_LIMIT = 10
Log = evaluate.Log


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    question: str
    file: str
    pages: frozenset[int]
    kind: str
    group: str


def load_questions(path: Path) -> list[Question]:
    """The questions of a JSON-lines file; a line without the required fields is an error naming it."""
    out, seen = [], set()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            question = Question(id=str(row["id"]), question=str(row["question"]), file=str(row["file"]),
                                pages=frozenset(int(p) for p in row["pages"]), kind=str(row.get("kind", "text")),
                                group=str(row["id"]).split("-", 1)[0])
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{n}: not a question (id, question, file, pages): {exc}") from None
        if question.id in seen:
            raise ConfigError(f"{path}:{n}: question id {question.id!r} twice")
        if not question.pages:
            raise ConfigError(f"{path}:{n}: question {question.id!r} lists no page")
        seen.add(question.id)
        out.append(question)
    if not out:
        raise ConfigError(f"{path} holds no question")
    return out


def check_documents(folder: Path, questions: Sequence[Question], manifest: Path | None) -> dict[str, Any]:
    """Every expected file exists; with a manifest, every listed document is there with its sha256."""
    missing = sorted({q.file for q in questions if not (folder / q.file).is_file()})
    if missing:
        raise ConfigError(f"{len(missing)} expected file(s) not in {folder}: {', '.join(missing[:5])}")
    if manifest is None or not manifest.is_file():
        return {"manifest": None}
    listed = json.loads(manifest.read_text(encoding="utf-8")).get("documents", {})
    wrong = []
    for name, meta in listed.items():
        path = folder / name
        if not path.is_file():
            wrong.append(f"{name} (missing)")
        elif hashlib.sha256(path.read_bytes()).hexdigest() != meta.get("sha256"):
            wrong.append(f"{name} (sha256 differs)")
    if wrong:
        raise ConfigError(f"{folder} does not hold the documents of {manifest}: {', '.join(wrong[:5])}")
    return {"manifest": str(manifest), "documents_checked": len(listed)}


def score(questions: Sequence[Question], hits: dict[str, list[tuple[str, int | None]]]) -> dict[str, Any]:
    """The measures over `questions`, given each one's ranked (key, page_no) hits."""
    n = len(questions)
    doc_hit = {k: 0 for k in KS}
    page_hit = {k: 0 for k in KS}
    doc_rr = page_rr = 0.0
    for q in questions:
        ranked = hits.get(q.id, [])
        doc_rank = next((i for i, (key, _) in enumerate(ranked, 1) if key == q.file), None)
        page_rank = next((i for i, (key, page) in enumerate(ranked, 1) if key == q.file and page in q.pages),
                         None)
        for k in KS:
            doc_hit[k] += doc_rank is not None and doc_rank <= k
            page_hit[k] += page_rank is not None and page_rank <= k
        doc_rr += 1 / doc_rank if doc_rank else 0.0
        page_rr += 1 / page_rank if page_rank else 0.0
    out: dict[str, Any] = {"questions": n}
    out.update({f"doc_hit@{k}": round(doc_hit[k] / n, 4) for k in KS})
    out.update({f"page_hit@{k}": round(page_hit[k] / n, 4) for k in KS})
    out["doc_mrr"] = round(doc_rr / n, 4)
    out["page_mrr"] = round(page_rr / n, 4)
    return out


def _breakdown(questions: Sequence[Question], hits: dict[str, list[tuple[str, int | None]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"all": score(questions, hits)}
    for label, attr in (("kind", "kind"), ("group", "group")):
        for value in sorted({getattr(q, attr) for q in questions}):
            out[f"{label}:{value}"] = score([q for q in questions if getattr(q, attr) == value], hits)
    return out


async def _ask(owner_url: str, tenant_id: Any, tenant: str, questions: Sequence[Question], mode: str,
               embedder: Any, limit: int, settings: Settings, log: Log) -> dict[str, Any]:
    from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
    from kdbl_core.db.connect import async_pool
    from kdbl_core.db.urls import for_role
    from kdbl_core.search import pipeline
    from kdbl_core.search.plan import SearchPlan

    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=2, name="kdbl-eval-docs")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:eval",
                          scopes=frozenset(ALL_SCOPES))
    hits: dict[str, list[tuple[str, int | None]]] = {}
    latencies: list[float] = []
    served: dict[str, int] = {}
    degraded: set[str] = set()
    errors: list[str] = []
    try:
        for i, q in enumerate(questions, 1):
            try:
                pipeline.check_query(q.question, settings)
                request = pipeline.SearchRequest(query=q.question, mode=mode, limit=limit)
                start = time.perf_counter()
                async with rls_transaction(pool, principal) as conn:
                    result = await SearchPlan(request, settings=settings, embedder=embedder).run(conn)
                latencies.append((time.perf_counter() - start) * 1000)
            except KdblError as exc:
                errors.append(f"{q.id}: {exc}")
                hits[q.id] = []
                continue
            hits[q.id] = [(hit["key"], hit.get("page_no")) for hit in result.hits]
            served[result.mode] = served.get(result.mode, 0) + 1
            if result.degraded_reason:
                degraded.add(result.degraded_reason)
            if i % 50 == 0:
                log(f"eval: {mode}: {i}/{len(questions)} questions")
    finally:
        await pool.close()
    return {"hits": hits, "latencies": latencies, "served": served, "degraded_reasons": sorted(degraded),
            "errors": errors}


_HIDDEN = "hidden:"
_RESTORE = ("UPDATE chunks SET embedding_model = substr(embedding_model, length(%(h)s) + 1) "
            "WHERE tenant_id = %(t)s AND starts_with(embedding_model, %(h)s)")
_HIDE = ("UPDATE chunks SET embedding_model = %(h)s || embedding_model WHERE tenant_id = %(t)s "
         "AND embedding IS NOT NULL AND id > %(cut)s AND NOT starts_with(embedding_model, %(h)s)")
_EMBEDDED = ("SELECT count(*) AS n, count(*) FILTER (WHERE embedding IS NOT NULL "
             "AND NOT starts_with(embedding_model, %(h)s)) AS embedded FROM chunks WHERE tenant_id = %(t)s")


@contextmanager
def partly_embedded(owner_url: str, tenant_id: Any) -> Iterator[Callable[[float], dict[str, int]]]:
    """Inside, `keep(share)` leaves only the first `share` of the tenant's chunks by id with their vectors
    (module docstring) and returns {"chunks", "embedded"}; call it with falling shares, since a vector set
    aside stays aside (each such row update also updates the HNSW index: ~20 ms a row here). Every vector
    is put back on entry (a killed run's) and on the way out, whatever happens."""
    import psycopg

    from kdbl_core.db.urls import libpq

    with psycopg.connect(libpq(owner_url), autocommit=True) as conn:
        def keep(share: float) -> dict[str, int]:
            [n, _] = conn.execute(_EMBEDDED, {"t": tenant_id, "h": _HIDDEN}).fetchone()
            cut = conn.execute("SELECT id FROM chunks WHERE tenant_id = %s ORDER BY id OFFSET %s LIMIT 1",
                               (tenant_id, max(0, int(share * n) - 1))).fetchone()
            if cut is not None:
                conn.execute(_HIDE, {"t": tenant_id, "cut": cut[0], "h": _HIDDEN})
            conn.execute("ANALYZE chunks")
            [n, embedded] = conn.execute(_EMBEDDED, {"t": tenant_id, "h": _HIDDEN}).fetchone()
            return {"chunks": n, "embedded": embedded}

        conn.execute(_RESTORE, {"t": tenant_id, "h": _HIDDEN})
        try:
            yield keep
        finally:
            conn.execute(_RESTORE, {"t": tenant_id, "h": _HIDDEN})


def _scored(questions: Sequence[Question], ran: dict[str, Any], mode: str) -> dict[str, Any]:
    scored = _breakdown(questions, ran["hits"])
    lat = ran["latencies"]
    scored["latency_ms"] = ({"p50": round(evaluate.ir_metrics.percentile(lat, 50), 2),
                             "p95": round(evaluate.ir_metrics.percentile(lat, 95), 2)} if lat else None)
    if set(ran["served"]) - {mode}:
        scored["served_as"] = ran["served"]
    if ran["degraded_reasons"]:
        scored["degraded_reasons"] = ran["degraded_reasons"][:3]
    if ran["errors"]:
        scored["errors"] = ran["errors"][:20]
    scored["misses"] = [q.id for q in questions if not any(key == q.file for key, _ in ran["hits"].get(q.id, []))]
    return scored


def run_docs_eval(owner_url: str, folder: Path, questions_path: Path, *, modes: Sequence[str] = ("lexical",),
                  model_path: Path | None = None, limit: int = DEFAULT_LIMIT, tenant: str | None = None,
                  embedded_shares: Sequence[float] = (), unanswerable: Path | None = None,
                  log: Log = evaluate._stderr) -> dict[str, Any]:
    """Index `folder` into a tenant of its own, ask every question once per mode, score; a JSON-able dict.
    `tenant` defaults to one derived from the folder, so a re-run over the same database reuses the index.
    `embedded_shares`: hybrid again with only that share of the chunks embedded (key "hybrid@10%");
    `unanswerable`: the answer tool judged too (key "answers")."""
    folder, questions_path = folder.expanduser().resolve(), questions_path.expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"{folder} is not a folder of documents")
    unknown = [m for m in modes if m not in evaluate.MODES]
    if unknown or not modes:
        raise ConfigError(f"unknown mode(s) {unknown or '(none)'}; choose from {', '.join(evaluate.MODES)}")
    if not 1 <= limit <= 100:
        raise ConfigError(f"limit must lie in [1, 100] (search_content's maximum), got {limit}")
    bad = [s for s in embedded_shares if not 0 < s < 1]
    if bad:
        raise ConfigError(f"--embedded-share must lie strictly between 0 and 1, got {bad[0]}")
    questions = load_questions(questions_path)
    declined = eval_answers.load_unanswerable(unanswerable) if unanswerable is not None else []
    checked = check_documents(folder, questions, questions_path.parent / "manifest.json")
    settings = get_settings()
    machine = evaluate._machine()
    tenant = tenant or "evaldocs-" + hashlib.sha256(str(folder).encode()).hexdigest()[:10]
    log(f"eval: indexing {folder} into tenant {tenant}")
    started = time.monotonic()
    indexed = ensure_indexed(owner_url, folder, tenant, token_name=None)
    log(f"eval: {indexed['chunks']} chunks in {time.monotonic() - started:.0f} s ({indexed['crawl']})")
    with partly_embedded(owner_url, indexed["tenant_id"]):
        pass  # vectors a killed run set aside are put back before any mode runs
    embedder, embedding = None, None
    if model_path is not None and (embedded_shares or declined or any(m in ("semantic", "hybrid") for m in modes)):
        from kdbl_core.embedder import Embedder

        embedder = Embedder(model_path, n_threads=settings.embed_threads, max_tokens=settings.embed_max_tokens,
                            query_cache_size=0)
        embedding = evaluate.embed_chunks(owner_url, indexed["tenant_id"], embedder, settings.embed_batch, log)
    results: dict[str, Any] = {}
    try:
        for mode in dict.fromkeys(modes):
            if mode in ("semantic", "hybrid") and embedder is None:
                results[mode] = {"unavailable": "no embedding model (give --model or build the default GGUF)"}
                continue
            ran = asyncio.run(_ask(owner_url, indexed["tenant_id"], tenant, questions, mode, embedder, limit,
                                   settings, log))
            results[mode] = _scored(questions, ran, mode)
        if embedded_shares and embedder is None:
            results.update({f"hybrid@{share:.0%}": {"unavailable": "no embedding model (give --model or build "
                                                                   "the default GGUF)"} for share in embedded_shares})
        elif embedded_shares:
            with partly_embedded(owner_url, indexed["tenant_id"]) as keep:
                for share in sorted(set(embedded_shares), reverse=True):
                    counts = keep(share)
                    log(f"eval: hybrid with {counts['embedded']:,} of {counts['chunks']:,} chunks embedded")
                    ran = asyncio.run(_ask(owner_url, indexed["tenant_id"], tenant, questions, "hybrid", embedder,
                                           limit, settings, log))
                    results[f"hybrid@{share:.0%}"] = {**_scored(questions, ran, "hybrid"), **counts}
        answers = (eval_answers.run_answers(owner_url, indexed["tenant_id"], tenant, questions, declined, embedder,
                                            settings, log) if unanswerable is not None else None)
    finally:
        if embedder is not None:
            embedder.close()
    return {"folder": str(folder), "questions_file": str(questions_path), "questions": len(questions),
            "files": indexed["crawl"].get("files"), "chunks": indexed["chunks"], "modes": results,
            **({"answers": answers} if answers is not None else {}),
            "machine": machine, "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "settings": {"tenant": tenant, "limit": limit, "documents": checked, "crawl": indexed["crawl"],
                         "embedding": embedding, "ts_config": settings.text_search_config,
                         "chunking": {"target_chars": settings.chunk_target_chars,
                                      "max_chars": settings.chunk_max_chars}}}


def summarise(result: dict[str, Any]) -> str:
    lines = [f"{Path(result['folder']).name}: {result['questions']} questions, {result['files']} files, "
             f"{result['chunks']} chunks — {result['date']}, {result['machine'].get('cpus')} CPUs, "
             f"limit {result['settings']['limit']}"]
    cols = [f"doc_hit@{k}" for k in KS] + ["doc_mrr"] + [f"page_hit@{k}" for k in KS] + ["page_mrr"]
    head = f"{'mode / part':24}{'n':>5}" + "".join(f"{c.replace('_hit', ''):>10}" for c in cols) + f"{'p50 ms':>9}"
    lines += [head, "-" * len(head)]
    for mode, data in result["modes"].items():
        if "unavailable" in data:
            lines.append(f"{mode:24}  unavailable: {data['unavailable']}")
            continue
        lat = (data.get("latency_ms") or {}).get("p50", float("nan"))
        for part, measured in data.items():
            if not isinstance(measured, dict) or "questions" not in measured:
                continue
            name = mode if part == "all" else f"  {part}"
            lines.append(f"{name:24}{measured['questions']:>5}" + "".join(f"{measured[c]:>10.3f}" for c in cols)
                         + (f"{lat:>9.1f}" if part == "all" else ""))
        if data.get("served_as"):
            lines.append(f"  served as {data['served_as']}: {data.get('degraded_reasons')}")
        elif data.get("degraded_reasons"):
            lines.append(f"  degraded: {data['degraded_reasons'][0]}")
    answers = result.get("answers")
    if answers:
        lines.append(f"answer ({answers['search']} search): found {answers['found_answerable']:.3f} of "
                     f"{answers['answerable']} answerable, {answers['found_unanswerable']:.3f} of "
                     f"{answers['unanswerable']} unanswerable; precision {answers['precision_found']:.3f}; cites the "
                     f"right file {answers['cites_right_file']:.3f}, page {answers['cites_right_page']:.3f} "
                     f"(first citation {answers['first_cites_right_page']:.3f}); {answers['sentences']} sentences, "
                     f"{answers['chars']} characters an answer; p50 {answers['p50_ms']} ms")
    return "\n".join(lines)


def cli_eval_docs(args: Any, settings: Settings) -> int:
    """`kdbl-control eval FOLDER --questions FILE`: embedded Postgres under the work dir unless
    KDBL_DATABASE_URL is set (and --data-dir is not given)."""
    from kdbl_core.db.embedded_postgres import EmbeddedDatabase

    work = Path(args.work_dir or Path(tempfile.gettempdir()) / "kdbl-eval").expanduser().resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or evaluate.default_model_path(settings)
    modes = args.mode or ["lexical"]
    if model is not None and not Path(model).is_file():
        raise ConfigError(f"embedding model not found: {model}")
    options = {"modes": modes, "model_path": model, "limit": args.limit or DEFAULT_LIMIT,
               "embedded_shares": args.embedded_share or (), "unanswerable": args.unanswerable}
    if settings.database_url is not None and args.data_dir is None:
        result = run_docs_eval(settings.database_url.get_secret_value(), args.dataset, args.questions, **options)
    else:
        with EmbeddedDatabase(args.data_dir or work / "db", settings=settings) as db:
            result = run_docs_eval(db.owner_url, args.dataset, args.questions, **options)
    print(json.dumps(result, indent=2, default=str) if args.json else summarise(result))
    return 0


__all__ = ["KS", "Question", "cli_eval_docs", "load_questions", "run_docs_eval", "score", "summarise"]
