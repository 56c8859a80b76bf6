"""Crawl one source: list, skip unchanged files, extract + chunk + index changed ones, drop deleted ones.

Each file is written in its own transaction. Problems with single files become that file's status;
a source that cannot be listed at all aborts the crawl *without* deleting anything.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Engine, text

from kdbl_core.db import content
from kdbl_core.db.engine import tenant_transaction
from kdbl_core.settings import Settings
from kdbl_worker import extract
from kdbl_worker.chunking import chunk_blocks
from kdbl_worker.connectors import Connector, RemoteFile, connector_for

log = logging.getLogger(__name__)

Progress = Callable[["CrawlStats", str], None]


@dataclass(slots=True)
class CrawlStats:
    source_id: uuid.UUID
    listed: int = 0
    indexed: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    chunks: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SourceRow:
    id: uuid.UUID
    tenant_id: uuid.UUID
    protocol: str
    config: dict
    enabled: bool


def load_sources(engine: Engine, *, tenant: str | None = None, source_id: uuid.UUID | None = None) -> list[SourceRow]:
    sql = ("SELECT s.id, s.tenant_id, s.protocol, s.config, s.enabled FROM sources s "
           "JOIN tenants t ON t.id = s.tenant_id WHERE true")
    params: dict = {}
    if tenant is not None:
        sql += " AND t.name = :tenant"
        params["tenant"] = tenant
    if source_id is not None:
        sql += " AND s.id = :sid"
        params["sid"] = source_id
    with engine.connect() as conn:
        rows = conn.execute(text(sql + " ORDER BY t.name, s.name"), params).all()
    return [SourceRow(r.id, r.tenant_id, r.protocol, r.config, r.enabled) for r in rows]


def _clean(value: str) -> str:
    """Postgres text holds neither NUL nor lone surrogates; keep offsets by mapping 1:1."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode("utf-8")
    return value


def _unchanged(state: content.FileState | None, remote: RemoteFile) -> bool:
    if state is None or state.status == "pending":
        return False
    if remote.etag is not None and state.etag is not None:
        return remote.etag == state.etag and remote.size == state.size
    return remote.size == state.size and remote.mtime == state.mtime


class Indexer:
    """Turns files of one source into rows, one transaction per file."""

    def __init__(self, engine: Engine, settings: Settings) -> None:
        self.engine = engine
        self.settings = settings

    def index_file(self, source: SourceRow, connector: Connector, remote: RemoteFile) -> tuple[str, int]:
        content_type, _ = extract.detect(remote.key)
        if remote.size > self.settings.max_file_bytes:
            result = extract.Extraction.skipped(
                f"file too large ({remote.size} bytes > limit {self.settings.max_file_bytes})", content_type
            )
        else:
            try:
                with connector.open(remote.key) as stream:
                    result = extract.extract(extract.Source(stream, remote.key, remote.size, content_type))
            except OSError as exc:
                result = extract.Extraction.failed(f"cannot read file: {exc.strerror or exc}", content_type)
        for block in result.blocks:
            block.text = _clean(block.text)
        full_text, chunks = chunk_blocks(
            result.blocks, target=self.settings.chunk_target_chars, max_chars=self.settings.chunk_max_chars
        )
        meta = content.FileMeta(
            key=remote.key, size=remote.size, mtime=remote.mtime, etag=remote.etag,
            content_type=result.content_type or content_type, storage_class=remote.storage_class,
            owner=remote.owner, mode=remote.mode, uid=remote.uid, gid=remote.gid,
        )
        rows = [content.ChunkRow(c.seq, c.text, c.char_start, c.char_end, c.page_no, c.ts_start_ms, c.ts_end_ms)
                for c in chunks]
        with tenant_transaction(self.engine, source.tenant_id) as conn:
            content.write_file(
                conn, tenant_id=source.tenant_id, source_id=source.id, meta=meta, status=result.status,
                status_reason=result.reason, title=_clean(result.title) if result.title else None,
                chunks=rows, text_chars=len(full_text), ts_config=self.settings.text_search_config,
            )
        return result.status, len(rows)

    def crawl(self, source: SourceRow, progress: Progress | None = None) -> CrawlStats:
        started = time.monotonic()
        stats = CrawlStats(source_id=source.id)
        connector = connector_for(source.protocol, source.config)
        with tenant_transaction(self.engine, source.tenant_id) as conn:
            known = content.load_file_states(conn, source.id)
        listed: set[str] = set()
        for remote in connector.walk():
            listed.add(remote.key)
            stats.listed += 1
            if _unchanged(known.get(remote.key), remote):
                stats.unchanged += 1
            else:
                status, n_chunks = self.index_file(source, connector, remote)
                stats.indexed += 1
                stats.chunks += n_chunks
                stats.bytes += remote.size
                if status == "failed":
                    stats.failed += 1
            if progress is not None:
                progress(stats, remote.key)
        gone = set(known) - listed
        with tenant_transaction(self.engine, source.tenant_id) as conn:
            if gone:
                stats.deleted = content.delete_files(conn, source.tenant_id, source.id, sorted(gone))
            content.mark_source_indexed(conn, source.id)
        stats.problems = list(connector.problems.items)
        stats.seconds = time.monotonic() - started
        log.info("crawl finished", extra={
            "source_id": str(source.id), "listed": stats.listed, "indexed": stats.indexed,
            "unchanged": stats.unchanged, "deleted": stats.deleted, "failed": stats.failed,
            "seconds": round(stats.seconds, 3),
        })
        return stats
