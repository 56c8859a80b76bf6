"""Small builders the tests share: a tenant with a folder source, crawled for real."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.pipeline import CrawlStats, Indexer, load_sources


@dataclass
class Corpus:
    tenant: str
    tenant_id: uuid.UUID
    source_id: uuid.UUID
    root: Path


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
    t = admin.create_tenant(owner_engine, tenant, exist_ok=True)
    s = admin.add_source(owner_engine, tenant, protocol="fs", config={"root": str(root)}, name=root.name,
                         restricted=restricted)
    corpus = Corpus(tenant, t.id, s.id, root)
    crawl(worker_engine, corpus)
    return corpus


def crawl(worker_engine, corpus: Corpus) -> CrawlStats:
    indexer = Indexer(worker_engine, Settings())
    [source] = load_sources(worker_engine, source_id=corpus.source_id)
    return indexer.crawl(source)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_api(owner_url: str, settings: Settings | None = None) -> Iterator[str]:
    """The real API app under uvicorn on a loopback port, as the kdbl_api role; yields its base URL."""
    from kdbl_api.app import create_app
    from kdbl_core.db.engine import async_engine
    from kdbl_core.db.urls import for_role

    port = free_port()
    settings = settings or Settings(mcp_enabled=True)
    app = create_app(settings, async_engine(for_role(owner_url, "kdbl_api")))
    # proxy_headers=False as kdbl-api (kdbl_api.main): uvicorn's default believes X-Forwarded-For from loopback
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           proxy_headers=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("API did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
