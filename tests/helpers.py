"""Small builders the tests share: a tenant with a folder source, crawled for real."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

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
