"""BEIR-format data sets (corpus.jsonl, queries.jsonl, qrels/<split>.tsv) indexed through the real pipeline.

Shared by `kdbl-control bench search` and `kdbl-control eval`: each corpus document becomes one text file
`<_id>.txt` holding title + blank line + text, and the folder is crawled into a tenant of its own by the
same worker code that indexes any fs source.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import psycopg

from kdbl_control import admin, compose
from kdbl_core.content import bm25_lists
from kdbl_core.db.connect import conninfo, sync_pool
from kdbl_core.db.urls import for_role
from kdbl_core.errors import ConfigError
from kdbl_core.settings import get_settings

DOC_SUFFIX = ".txt"


def doc_text(doc: dict[str, Any]) -> str:
    """What a document is, for every system measured: title, blank line, text."""
    return f"{doc.get('title') or ''}\n\n{doc.get('text') or ''}"


def doc_file_name(doc_id: str) -> str:
    if not doc_id or "/" in doc_id or "\\" in doc_id or doc_id in (".", "..") or "\x00" in doc_id:
        raise ConfigError(f"corpus document id {doc_id!r} cannot be used as a file name")
    return f"{doc_id}{DOC_SUFFIX}"


def doc_id_of_key(key: str) -> str:
    """The BEIR document id a file key stands for (inverse of doc_file_name)."""
    return key.removesuffix(DOC_SUFFIX)


def iter_corpus(dataset: Path):
    with open(dataset / "corpus.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                doc = json.loads(line)
                doc["_id"] = str(doc["_id"])
                yield doc


def materialise_beir(dataset: Path, out: Path) -> int:
    """Write corpus.jsonl documents as text files (title + abstract), once."""
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for doc in iter_corpus(dataset):
        target = out / doc_file_name(doc["_id"])
        if not target.exists():
            target.write_text(doc_text(doc), encoding="utf-8")
        count += 1
    return count


def load_queries(dataset: Path, limit: int) -> list[str]:
    """The first `limit` query texts, in file order (for latency benchmarks)."""
    queries = []
    with open(dataset / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                queries.append(json.loads(line)["text"])
                if len(queries) >= limit:
                    break
    return queries


def load_query_map(dataset: Path) -> dict[str, str]:
    """query id -> text, in file order."""
    out: dict[str, str] = {}
    with open(dataset / "queries.jsonl", encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                q = json.loads(line)
                out[str(q["_id"])] = q["text"]
    return out


def load_qrels(dataset: Path, split: str) -> dict[str, dict[str, int]]:
    """qrels/<split>.tsv (query-id, corpus-id, score; header row optional) -> {qid: {doc_id: grade}}."""
    path = dataset / "qrels" / f"{split}.tsv"
    if not path.is_file():
        raise ConfigError(f"{path} not found (is '{split}' a split of this data set?)")
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as handle:
        for row in csv.reader(handle, delimiter="\t"):
            if not row or len(row) < 3:
                continue
            qid, did, grade = row[0].strip(), row[1].strip(), row[2].strip()
            try:
                value = int(float(grade))
            except ValueError:
                if qid.lower() in ("query-id", "query_id", "qid"):
                    continue  # header
                raise ConfigError(f"{path}: bad relevance grade {grade!r}") from None
            qrels.setdefault(qid, {})[did] = value
    return qrels


def ensure_indexed(owner_url: str, docs: Path, tenant: str = "bench-search", *,
                   token_name: str | None = "bench") -> dict[str, Any]:
    """Create `tenant` with one fs source over `docs` (idempotent), crawl it, count its chunks.

    Returns tenant_id, source_id, chunks, crawl stats and, when `token_name` is given, a fresh PAT."""
    worker = sync_pool(for_role(owner_url, "kdbl_worker"), size=6, name="kdbl-beir-crawl")
    try:
        with sync_pool(owner_url, size=1) as db:
            row = admin.create_tenant(db, tenant, exist_ok=True)
            source = admin.add_source(db, tenant, protocol="fs", config={"root": str(docs)}, name="corpus",
                                      exist_ok=True)
            token = admin.create_token(db, tenant_name=tenant, name=token_name)[0] if token_name else None
        [loaded] = compose.load_sources(worker, source_id=source.id)
        stats = compose.indexer(worker, get_settings()).crawl(loaded)
    finally:
        worker.close()
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        if stats.indexed:
            # What the worker does after a crawl run (kdbl_worker.queue: pack the keyword lists when due)
            # and autovacuum a minute or two after a bulk load (statistics, visibility map for index-only
            # scans of postings; the writers' own generations of the lists a full build replaced — left
            # dead, ~10 index entries a live list at SciFact's size, they made the keyword statement
            # 6x slower, 9.2 against 1.4 ms): measure the steady state, not the first minute.
            kind = bm25_lists.due(conn, row.id)
            if kind is not None:
                bm25_lists.build(conn, row.id, kind)
            conn.execute("VACUUM (ANALYZE) postings, chunks, files, term_stats, bm25_lists, bm25_dead")
        chunks, files_with_chunks = conn.execute(
            "SELECT count(*), count(DISTINCT file_id) FROM chunks WHERE tenant_id = %(t)s", {"t": row.id}).fetchone()
    return {"tenant_id": row.id, "source_id": source.id, "token": token, "chunks": chunks,
            "files_with_chunks": files_with_chunks, "crawl": {
                "files": stats.listed, "indexed": stats.indexed, "failed": getattr(stats, "failed", None),
                "seconds": round(stats.seconds, 2),
                "files_per_s": round(stats.indexed / stats.seconds, 1) if stats.indexed else None}}
