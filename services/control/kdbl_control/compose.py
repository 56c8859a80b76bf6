"""The composition root: the one module of any service that may import another service.

`kdbl-control up` runs the API, the worker's fetch endpoint, crawl and embedding in one process, and
`crawl`, `eval`, `bench search` and `formats` drive the worker's own code (the same indexer, queue,
embedding loop and format table the deployed worker runs, so what they measure is what ships), and
`mcp smoke` speaks MCP with the client the API holds (the MCP SDK is the API's alone). Every
such reach from kdbl_control into kdbl_worker or kdbl_api goes through here, and the import-linter
contract "services do not import each other" (pyproject.toml, [tool.importlinter]) allows exactly the
imports of this module; any other cross-service import fails `./dev test` (tests/unit/test_import_layers.py).

Each function imports its service module when it is called, so a command loads only what it uses:
`kdbl-control formats` loads the format table (0.03 s) and not the crawl pipeline (0.43 s) or the
API app (1.17 s, measured with `python -c 'import …'` on the dev machine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only; the modules load on first call below
    from kdbl_core.db.connect import Pool
    from kdbl_core.embedder import Embedder
    from kdbl_core.settings import Settings
    from kdbl_worker.jobs import JobStatus
    from kdbl_worker.pipeline import CrawlStats, Indexer, SourceRow

__all__ = ["CrawlStats", "Indexer", "SourceRow", "connector", "create_api_app", "create_fetch_app", "crawl_stats",
           "embed_pending", "enqueue", "extract_entities", "format_markdown", "format_rows", "indexer", "load_embedder",
           "load_sources", "mcp_smoke", "refuse_paths", "wait_for"]


# --- the worker ---

def indexer(pool: Pool, settings: Settings) -> Indexer:
    """The worker's crawl pipeline for `crawl`, `up` and the BEIR loader (`pool`: the worker role's)."""
    from kdbl_worker.pipeline import Indexer

    return Indexer(pool, settings)


def refuse_paths(*paths: Any) -> None:
    """Folders no source of this process may read, by any path or link (`up`: its data folder)."""
    from kdbl_worker.connectors import refuse_paths

    refuse_paths(*paths)


def connector(protocol: str, config: dict[str, Any]) -> Any:
    """A source's connector as the worker builds it (`bench smb-permissions` lists a share with it)."""
    from kdbl_worker.connectors import connector_for

    return connector_for(protocol, config)


def load_sources(pool: Pool, **where: Any) -> list[SourceRow]:
    from kdbl_worker.pipeline import load_sources

    return load_sources(pool, **where)


def crawl_stats() -> CrawlStats:
    """Zero counts, for a progress line before a crawl reports its first."""
    from kdbl_worker.pipeline import CrawlStats

    return CrawlStats(source_id=None)  # type: ignore[arg-type]


def enqueue(pool: Pool, source_ids: list[Any]) -> list[int]:
    """Queue crawl runs for the workers (`crawl --queue`)."""
    from kdbl_worker.queue import enqueue

    return enqueue(pool, source_ids)


def wait_for(pool: Pool, ids: list[int], **options: Any) -> dict[int, JobStatus]:
    from kdbl_worker.queue import wait_for

    return wait_for(pool, ids, **options)


def extract_entities(pool: Pool, **options: Any) -> int:
    """Read the named entities of waiting files with the worker's own stage (`up`, `crawl`)."""
    from kdbl_worker.entity_stage import extract_pending

    return extract_pending(pool, **options)


def embed_pending(pool: Pool, embedder: Embedder, **options: Any) -> int:
    """Fill missing chunk embeddings with the worker's own loop (`up`, `eval`)."""
    from kdbl_worker.vectorize import embed_pending

    return embed_pending(pool, embedder, **options)


def create_fetch_app(settings: Settings, pool: Pool) -> Any:
    from kdbl_worker.fetch import create_fetch_app

    return create_fetch_app(settings, pool)


def format_rows() -> list[dict[str, str]]:
    """The worker's dispatch table as rows (`kdbl-control formats`): the table the worker extracts by."""
    from kdbl_worker.extract import formats

    return formats.rows()


def format_markdown() -> str:
    from kdbl_worker.extract import formats

    return formats.markdown()


# --- the API ---

def load_embedder(settings: Settings) -> Embedder | None:
    from kdbl_api.app import load_embedder

    return load_embedder(settings)


def create_api_app(settings: Settings, database_url: str, embedder: Embedder | None) -> Any:
    """The API app (kdbl_api.app.create_app): it opens its own pool on `database_url` in its lifespan."""
    from kdbl_api.app import create_app

    return create_app(settings, database_url, embedder)


async def mcp_smoke(api_url: str, token: str, query: str) -> dict[str, Any]:
    """`mcp smoke`: one initialize → tools/list → tools/call round with the MCP SDK's client, which
    only the API imports (kdbl_api.mcp_smoke; the contract "the MCP SDK only in kdbl_api")."""
    from kdbl_api.mcp_smoke import run_smoke

    return await run_smoke(api_url, token, query)
