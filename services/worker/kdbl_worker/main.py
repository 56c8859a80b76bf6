"""`kdbl-worker`: serve the crawl queue as the non-owner kdbl_worker role, plus the internal fetch endpoint.

Any number of replicas share the queue (kdbl_worker.queue): each queues scheduled runs that are due
(kdbl_worker.schedule), lists sources, and indexes changed files one transaction each, holding leases
that a heartbeat renews while the work progresses. SIGTERM/SIGINT stop it within seconds, at any point:
a file write still running 2 s after the signal is aborted (rolled back, never half-written), the
leases it holds on unstarted work are handed back at once, and the process exits; a second signal
exits at once (leases then expire as after a crash).

It also serves the internal fetch endpoint (KDBL_FETCH_PORT, default 8081) that the API's signed
downloads read original bytes from (`--no-fetch` to leave it out, e.g. several workers on one host).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

import uvicorn

from kdbl_core import logging_setup
from kdbl_core.db.connect import assert_runtime_role_sync, sync_pool
from kdbl_core.embedder import Embedder
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings, load_settings
from kdbl_worker import entity_stage, sandbox
from kdbl_worker.fetch import create_fetch_app
from kdbl_worker.pipeline import Indexer, limits_from
from kdbl_worker.queue import QueueOptions, QueueRunner, make_holder
from kdbl_worker.vectorize import embed_pending

log = logging.getLogger("kdbl_worker")


EMBED_POLL_SECONDS = 10.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdbl-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--tenant", action="append", dest="tenants", metavar="NAME",
                        help="serve only these tenants' sources (repeatable; default: every tenant)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="do not queue scheduled runs (only serve the queue)")
    parser.add_argument("--lease-seconds", type=float, default=None, help="claim lease (default 60)")
    parser.add_argument("--stall-seconds", type=float, default=None,
                        help="without progress for this long, leases are left to expire (default: "
                             "max(extraction timeout, file deadline) + 5 s + lease)")
    parser.add_argument("--batch", type=int, default=16, help="items claimed at a time (default 16)")
    parser.add_argument("--extract-processes", type=int, default=None,
                        help="extraction child processes (default: cores/2, 1..4; 0 = in-process, no limits)")
    parser.add_argument("--idle-poll", type=float, default=1.0, help="seconds between polls when idle")
    parser.add_argument("--exit-when-idle", action="store_true", help="exit once no run is open (benchmarks)")
    parser.add_argument("--no-fetch", action="store_true", help="do not serve the internal fetch endpoint")
    return parser


def run_forever(settings: Settings, stop: threading.Event, args: argparse.Namespace | None = None) -> None:
    args = args or build_parser().parse_args([])
    # the queue loop, the heartbeat, the deadline watchdog and each writer thread's bookkeeping (the
    # file writes themselves run on a pool of their own: kdbl_worker.deadlines.write_pool)
    writers = max(1, int(getattr(settings, "write_connections", 2)))
    pool = sync_pool(settings.require_database_url(), size=3 + writers, name="kdbl-worker")
    assert_runtime_role_sync(pool, allow_privileged=settings.allow_privileged_db_role)
    processes = args.extract_processes if args.extract_processes is not None else \
        getattr(settings, "extract_processes", None)
    box = sandbox.Sandbox(processes, limits_from(settings))
    box.start()
    indexer = Indexer(pool, settings, box=box, lease_s=args.lease_seconds, stall_s=args.stall_seconds)
    options = QueueOptions(lease_s=indexer.lease_s, stall_s=indexer.stall_s, batch=max(1, args.batch),
                           idle_poll_s=args.idle_poll,
                           scheduler=not args.no_scheduler,
                           tenants=tuple(args.tenants) if args.tenants else None)
    runner = QueueRunner(pool, indexer, holder=make_holder(), options=options)
    log.info("worker started", extra={"holder": runner.holder, "lease_s": options.lease_s,
                                      "extract_processes": box.processes})
    embedding = None
    if settings.embed_model_path:  # lexical first: vectors fill in behind the crawl, on their own thread
        embedding = threading.Thread(target=_embed_loop, args=(settings, stop), name="embed", daemon=True)
        embedding.start()
    # named entities of sources that ask for them, behind the crawl too (kdbl_worker.entity_stage)
    entity_pool = sync_pool(settings.require_database_url(), size=1, name="kdbl-entities")
    entities = threading.Thread(target=entity_stage.loop, args=(entity_pool, stop), name="entities", daemon=True)
    entities.start()
    try:
        runner.run(stop, exit_when_idle=args.exit_when_idle)
    finally:
        stop.set()
        entities.join(timeout=30)
        entity_pool.close()
        if embedding is not None:
            embedding.join(timeout=30)
        indexer.close()
        box.close()
        pool.close()
        log.info("worker stopped", extra={"holder": runner.holder})


def _embed_loop(settings: Settings, stop: threading.Event) -> None:
    """Embed pending chunks of hybrid-enabled sources; poll every EMBED_POLL_SECONDS when idle."""
    pool = sync_pool(settings.require_database_url(), size=1, name="kdbl-embed")
    embedder = Embedder(settings.embed_model_path, n_threads=settings.embed_threads,
                        max_tokens=settings.embed_max_tokens, gpu_layers=settings.embed_gpu_layers)
    try:
        while not stop.is_set():
            try:
                embed_pending(pool, embedder, batch=settings.embed_batch, stop=stop)
            except Exception:  # noqa: BLE001 - keep the worker crawling; retry on the next poll
                log.exception("embedding pass failed")
            stop.wait(EMBED_POLL_SECONDS)
    finally:
        embedder.close()
        pool.close()


def serve_fetch(settings: Settings) -> uvicorn.Server:
    pool = sync_pool(settings.require_database_url(), size=4, name="kdbl-fetch")
    server = uvicorn.Server(uvicorn.Config(create_fetch_app(settings, pool), host=settings.fetch_host,
                                           port=settings.fetch_port, log_config=None, server_header=False))
    threading.Thread(target=server.run, name="fetch", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    settings = load_settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():  # the second signal: exit now (leases expire as after a crash)
            os._exit(128 + signum)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    try:
        fetch = None if args.no_fetch else serve_fetch(settings)
        run_forever(settings, stop, args)
        if fetch is not None:
            fetch.should_exit = True
    except ConfigError as exc:
        print(f"kdbl-worker: {exc.message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
