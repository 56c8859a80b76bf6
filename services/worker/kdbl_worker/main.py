"""`kdbl-worker`: crawl every enabled source periodically, as the non-owner kdbl_worker role.

It also serves the internal fetch endpoint (KDBL_FETCH_PORT, default 8081) that the API's signed
downloads read original bytes from. This slice crawls sources one after another on a fixed interval;
the lease-based job queue shared by many replicas comes with the worker issue.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

import uvicorn

from kdbl_core import logging_setup
from kdbl_core.db.engine import assert_runtime_role_sync, sync_engine
from kdbl_core.errors import ConfigError, KdblError
from kdbl_core.settings import Settings
from kdbl_worker.fetch import create_fetch_app
from kdbl_worker.pipeline import Indexer, load_sources

log = logging.getLogger("kdbl_worker")
INTERVAL_SECONDS = 60.0


def run_forever(settings: Settings, stop: threading.Event) -> None:
    engine = sync_engine(settings.require_database_url())
    assert_runtime_role_sync(engine, allow_privileged=settings.allow_privileged_db_role)
    indexer = Indexer(engine, settings)
    while not stop.is_set():
        for source in load_sources(engine):
            if stop.is_set() or not source.enabled:
                continue
            try:
                indexer.crawl(source)
            except KdblError as exc:
                log.warning("crawl failed", extra={"source_id": str(source.id), "error": exc.message})
        stop.wait(INTERVAL_SECONDS)
    engine.dispose()


def serve_fetch(settings: Settings) -> uvicorn.Server:
    engine = sync_engine(settings.require_database_url())
    server = uvicorn.Server(uvicorn.Config(create_fetch_app(settings, engine), host=settings.fetch_host,
                                           port=settings.fetch_port, log_config=None, server_header=False))
    threading.Thread(target=server.run, name="fetch", daemon=True).start()
    return server


def main() -> None:
    settings = Settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        fetch = serve_fetch(settings)
        run_forever(settings, stop)
        fetch.should_exit = True
    except ConfigError as exc:
        print(f"kdbl-worker: {exc.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
