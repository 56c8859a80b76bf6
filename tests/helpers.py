"""Small builders the tests share: a tenant with a folder source, crawled for real."""

from __future__ import annotations

import json
import math
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn

from kdbl_control import admin
from kdbl_core.access.principal import Principal
from kdbl_core.db.connect import Pool, sync_pool
from kdbl_core.settings import Settings
from kdbl_worker.bench_samples import pdf_file
from kdbl_worker.pipeline import CrawlStats, Indexer, load_sources


@dataclass
class Corpus:
    tenant: str
    tenant_id: uuid.UUID
    source_id: uuid.UUID
    root: Path


_POOLS: dict[str, Pool] = {}


# Every (term, chunk) posting, from the terms on each chunk's row (migration 0021), under the reader's
# row-level security on chunks: with the kdbl_bm25 extension a writer packs its lists and writes no postings
# rows, and a build deletes those it packs, so tests read the whole truth here.
POSTINGS = ("(SELECT c.tenant_id, t.term, c.id AS chunk_id, c.source_id, c.file_id, t.tf, c.token_count AS dl "
            "FROM chunks c CROSS JOIN LATERAL unnest(string_to_array(c.terms, ' '), c.tfs) AS t(term, tf))")


def bm25_reference(postings: dict[str, dict[str, tuple[int, int]]], qterms, k1: float = 1.2,
                   b: float = 0.75) -> dict[str, float]:
    """BM25 of each key over `postings` ({key: {term: (tf, dl)}}, one chunk a key) alone: the scores a
    caller who sees exactly those chunks must get."""
    n = len(postings)
    avgdl = sum(next(iter(t.values()))[1] for t in postings.values()) / n
    df = Counter(term for terms in postings.values() for term in terms)
    scores = {}
    for key, terms in postings.items():
        score = sum(math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * terms[t][0] * (k1 + 1)
                    / (terms[t][0] + k1 * (1 - b + b * terms[t][1] / avgdl)) for t in qterms if t in terms)
        if score > 0:
            scores[key] = score
    return scores


def db_of(engine) -> Pool:
    """The psycopg pool product functions take, for the same database and role as a test's SQLAlchemy
    engine (tests keep SQLAlchemy for their own ad-hoc SQL); one per URL, closed by `close_pools`."""
    url = engine.url.render_as_string(hide_password=False)
    if url not in _POOLS:
        _POOLS[url] = sync_pool(url, size=5, name="kdbl-test")
    return _POOLS[url]


def close_pools() -> None:
    while _POOLS:
        _POOLS.popitem()[1].close()


def make_corpus(owner_engine, worker_engine, root: Path, files: dict[str, str | bytes], *, tenant: str,
                restricted: bool = False) -> Corpus:
    root.mkdir(parents=True, exist_ok=True)
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)
    t = admin.create_tenant(db_of(owner_engine), tenant, exist_ok=True)
    s = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)},
                         name=root.name,
                         restricted=restricted)
    corpus = Corpus(tenant, t.id, s.id, root)
    crawl(worker_engine, corpus)
    return corpus


def crawl(worker_engine, corpus: Corpus) -> CrawlStats:
    indexer = Indexer(db_of(worker_engine), Settings())
    [source] = load_sources(db_of(worker_engine), source_id=corpus.source_id)
    return indexer.crawl(source)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def serving(app, **config) -> Iterator[str]:
    """An ASGI app under a real uvicorn on a loopback port, in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # fails at once if the thread ends; the bound is for a loaded machine
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def running_api(owner_url: str, settings: Settings | None = None, *, read_url: str | None = None) -> Iterator[str]:
    """The real API app under uvicorn on a loopback port, as the kdbl_api role (MCP calls reading at `read_url`,
    a replica's kdbl_api URL, when given); yields its base URL."""
    from kdbl_api.app import create_app
    from kdbl_core.db.urls import for_role

    settings = settings or Settings(mcp_enabled=True)
    app = create_app(settings, for_role(owner_url, "kdbl_api"), read_url=read_url)
    # proxy_headers=False as kdbl-api (kdbl_api.main): uvicorn's default believes X-Forwarded-For from loopback
    with serving(app, proxy_headers=False) as url:
        yield url


def entity_world(owner_engine, worker_engine, root: Path, files: dict[str, str], *, prefix: str,
                 grant: tuple[str, str]) -> dict:
    """A tenant with two folder sources with entities on, crawled and their entities read: `news` (open to
    all) over root/news and `board` (restricted; `grant` = (subject, file key) opens one file) over root/board;
    `files` are keyed 'news/...' or 'board/...'. Returns {tenant, tenant_id, open, closed, root}."""
    from kdbl_worker.entity_stage import extract_pending

    for key, body in files.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(body)
    db = db_of(owner_engine)
    tenant = f"{prefix}-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db, tenant)
    opened = admin.add_source(db, tenant, protocol="fs", config={"root": str(root / "news"), "entities": True},
                              name="news")
    closed = admin.add_source(db, tenant, protocol="fs", config={"root": str(root / "board"), "entities": True},
                              name="board", restricted=True)
    admin.add_grant(db, source_id=closed.id, subject=grant[0], file_key=grant[1])
    for source in (opened, closed):
        crawl(worker_engine, Corpus(tenant, t.id, source.id, root))
    assert extract_pending(db_of(worker_engine)) == len(files)
    return {"tenant": tenant, "tenant_id": t.id, "open": opened.id, "closed": closed.id, "root": root}


def one_entity_file(owner_engine, worker_engine, folder: Path, name: str, body: str, *, prefix: str) -> Principal:
    """`body` as folder/name in a fresh tenant's source with entities on, crawled and read; a reader of it."""
    from kdbl_worker.entity_stage import extract_pending

    (folder / name).write_text(body)
    db = db_of(owner_engine)
    tenant = f"{prefix}-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db, tenant)
    s = admin.add_source(db, tenant, protocol="fs", config={"root": str(folder), "entities": True}, name=prefix)
    crawl(worker_engine, Corpus(tenant, t.id, s.id, folder))
    assert extract_pending(db_of(worker_engine)) == 1
    return Principal(tenant_id=t.id, tenant_name=tenant, subject="user:zed")


@contextmanager
def running_fetch(worker_engine, token: str) -> Iterator[str]:
    """The worker's internal fetch endpoint (downloads' bytes) on a loopback port; yields its base URL."""
    from kdbl_worker.fetch import create_fetch_app

    with serving(create_fetch_app(Settings(internal_fetch_token=token), db_of(worker_engine))) as url:
        yield url


@contextmanager
def hybrid_tenant_api(owner_engine, worker_engine, owner_url: str, root: Path, files: dict[str, str | bytes], *,
                      prefix: str, embedder, embed_model_path) -> Iterator[dict]:
    """A fresh tenant whose folder source is crawled and embedded, an agent token of it, and the real API
    (with the embedding model) serving it; yields {"url", "token", "tenant", "corpus"}."""
    from kdbl_worker.vectorize import embed_pending

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, root, files, tenant=name)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id, batch=16) > 0
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    with running_api(owner_url, Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))) as url:
        yield {"url": url, "token": token, "tenant": name, "corpus": corpus}

def write_beir(folder: Path, docs: dict[str, tuple[str, str]], queries: dict[str, str],
               qrels: list[tuple[str, str]] = ()) -> Path:
    """A BEIR folder: corpus.jsonl ({doc id: (title, text)}), queries.jsonl ({query id: text}) and, when
    given, qrels/train.tsv ((query id, doc id) pairs, grade 1)."""
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": title, "text": text}) + "\n"
                                                 for d, (title, text) in docs.items()))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": text}) + "\n"
                                                  for q, text in queries.items()))
    if qrels:
        (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                    + "".join(f"{q}\t{d}\t1\n" for q, d in qrels))
    return folder


@asynccontextmanager
async def mcp_client(url: str, token: str):
    """The official SDK client over Streamable HTTP to the API at `url`, with the token as a Bearer header."""
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        yield client


async def search_and_read_a_window(client, source_id: str) -> tuple[list[float], dict]:
    """An agent's loop through any MCP client over the module fixtures' handbook corpus: tools/list, 20
    distinct searches (timed: no result-cache hits), then get_file_window at the hit's seq, each result
    held to its outputSchema. Returns the searches' milliseconds and the last search's result."""
    import jsonschema

    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert {"search_content", "get_file_window", "get_file_text", "list_sources"} <= set(tools)
    timings = []
    for i in range(20):
        started = time.perf_counter()
        result = await client.call_tool("search_content", {"query": f"okapi migration q{i}", "mode": "lexical"})
        timings.append((time.perf_counter() - started) * 1000)
    structured = result.structured_content
    jsonschema.validate(structured, tools["search_content"].output_schema)
    [hit] = structured["hits"]
    assert hit["key"] == "handbook.md" and hit["source_id"] == source_id
    window = (await client.call_tool("get_file_window", {"source_id": source_id, "key": hit["key"],
                                                          "start": hit["seq"]})).structured_content
    jsonschema.validate(window, tools["get_file_window"].output_schema)
    assert "okapi migration" in window["text"]
    return timings, structured


async def direct_search_timings(url: str, token: str, n: int = 20) -> list[float]:
    """Milliseconds of `n` distinct lexical searches over Streamable HTTP (the official client): the
    baseline a bridge or another transport is compared with."""
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    timings = []
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="legacy") as client:
        for i in range(n):
            started = time.perf_counter()
            await client.call_tool("search_content", {"query": f"okapi migration d{i}", "mode": "lexical"})
            timings.append((time.perf_counter() - started) * 1000)
    return timings


def grants_world(owner_engine, worker_engine, base: Path, *, prefix: str, open_files: dict[str, str],
                 restricted: dict[str, str], granted: str, other: dict[str, str]) -> dict:
    """Two lexical tenants for visibility probes: the first has source "a" (`open_files`, whole) and
    source "r" (`restricted`, restricted: user:alice is granted the file `granted` alone); the second
    tenant has source "o" (`other`). Returns {"tenant", "other_tenant", "a", "r", "o"} (source ids)."""
    db = db_of(owner_engine)
    names = (f"{prefix}-{uuid.uuid4().hex[:8]}", f"{prefix}-other-{uuid.uuid4().hex[:8]}")
    ids: dict = {"tenant": names[0], "other_tenant": names[1]}
    for tenant, folder, files, restrict in ((names[0], "a", open_files, False), (names[0], "r", restricted, True),
                                            (names[1], "o", other, False)):
        for key, body in files.items():
            (base / folder / key).parent.mkdir(parents=True, exist_ok=True)
            (base / folder / key).write_text(body)
        t = admin.create_tenant(db, tenant, exist_ok=True)
        s = admin.add_source(db, tenant, protocol="fs", config={"root": str(base / folder)}, name=folder,
                             hybrid=False, restricted=restrict)
        if restrict:
            admin.add_grant(db, source_id=s.id, subject="user:alice", file_key=granted)
        crawl(worker_engine, Corpus(tenant, t.id, s.id, base / folder))
        ids[folder] = s.id
    return ids


def make_pdf(pages: list[bytes], *, encrypt: bool = False, info: bytes = b"") -> bytes:
    """A PDF 1.4 file written by hand: one content stream per page, Helvetica text (PDF 32000-1 7.5).
    `encrypt` adds a standard security handler whose /U entry matches no password, so readers ask
    for one (an RC4 rev-2 dictionary, PDF 32000-1 7.6.3). `info`: Info dictionary entries (b"/Author (A)")."""
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    kids = []
    for content in pages:
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % len(objects))
        kids.append(len(objects))
    refs = b" ".join(b"%d 0 R" % k for k in kids)
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (refs, len(kids))
    trailer_extra = b""
    if encrypt:
        objects.append(b"<< /Filter /Standard /V 1 /R 2 /O <%s> /U <%s> /P -4 >>" % (b"ab" * 32, b"cd" * 32))
        trailer_extra = b" /Encrypt %d 0 R /ID [<%s> <%s>]" % (len(objects), b"01" * 16, b"01" * 16)
    if info:
        objects.append(b"<< %s >>" % info)
        trailer_extra += b" /Info %d 0 R" % len(objects)
    return pdf_file(objects, trailer_extra)


def pdf_text_page(text: str) -> bytes:
    return b"BT /F1 12 Tf 72 720 Td (%s) Tj ET" % text.encode("latin-1")


def wait_until(predicate, timeout: float, what: str, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy (that value); fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def cli(monkeypatch, capsys, owner_url: str, *argv: str) -> str:
    """`kdbl-control ARGV` in process against `owner_url`; its stdout (it must exit 0)."""
    from kdbl_control.cli import main as cli_main

    monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
    with pytest.raises(SystemExit) as done:
        cli_main(list(argv))
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    return out.out


def window_chunk_texts(window: dict) -> list[str]:
    """get_file_window's chunks' texts: each chunk's slice of the window's `text` (sent once)."""
    return [window["text"][c["offset"]:c["offset"] + c["length"]] for c in window["chunks"]]
