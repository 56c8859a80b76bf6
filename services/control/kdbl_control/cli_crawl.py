"""`kdbl-control crawl`: index sources now, in this process or queued for the kdbl-worker replicas."""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import open_pool
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    crawl = sub.add_parser("crawl", help="index sources now (blocks until done)")
    group = crawl.add_mutually_exclusive_group()
    group.add_argument("--tenant", help="only this tenant's sources (default: every source)")
    group.add_argument("--source", type=uuid.UUID, help="only this source (its id)")
    crawl.add_argument("--queue", action="store_true", help="queue runs for the kdbl-worker replicas")
    crawl.add_argument("--no-wait", action="store_true", help="with --queue: print run ids and return")
    crawl.add_argument("--timeout", type=float, help="with --queue: stop waiting after SECONDS")
    crawl.set_defaults(func=_crawl)


def _crawl(args: argparse.Namespace, settings: Settings) -> int:
    """On 6 connections: the queue loop, heartbeat, deadline watchdog and the writers' bookkeeping."""
    with open_pool(args, settings, size=6, name="kdbl-control-crawl") as db:
        from kdbl_control import compose

        sources = compose.load_sources(db, tenant=args.tenant, source_id=args.source)
        if not sources:
            raise ConfigError("no matching source")
        if args.queue:
            return _queued(args, settings, db, sources)
        return _here(settings, db, sources)


def _queued(args: argparse.Namespace, settings: Settings, db: Pool, sources: list[Any]) -> int:
    """Queue a run per source; wait for them (exit 1 when one failed, 3 at --timeout) unless --no-wait."""
    from kdbl_control import compose
    from kdbl_control.progress import queue_progress
    from kdbl_control.signals import stop_on_signals

    ids = compose.enqueue(db, [s.id for s in sources])
    print(" ".join(map(str, ids)), flush=True)  # at once: a script may read them while this waits
    if args.no_wait:
        return 0
    try:
        with stop_on_signals() as stop:
            statuses = compose.wait_for(db, ids, timeout_s=args.timeout, poll_s=1.0, stop=stop,
                                        on_progress=queue_progress(settings.progress_interval_s))
    except TimeoutError as exc:
        print(f"kdbl-control: {exc}", file=sys.stderr)
        return 3
    if stop.is_set():
        print("kdbl-control: stopped waiting; the runs go on in the workers", file=sys.stderr)
        return stop.exit_code
    for st in statuses.values():
        print(f"run {st.id} (source {st.source_id}): {st.state}, {st.listed} listed, {st.indexed} indexed, "
              f"{st.unchanged} unchanged, {st.deleted} deleted, {st.failed} failed"
              + (f": {st.last_error}" if st.last_error else ""), file=sys.stderr)
    return 1 if any(st.state == "failed" for st in statuses.values()) else 0


def _here(settings: Settings, db: Pool, sources: list[Any]) -> int:
    """Crawl each source in this process, then read the named entities the crawl left to read."""
    from kdbl_control import compose
    from kdbl_control.progress import crawl_with_progress, entity_progress
    from kdbl_control.signals import stop_on_signals

    indexer = compose.indexer(db, settings)
    try:
        with stop_on_signals() as stop:
            for source in sources:
                if crawl_with_progress(indexer, source, stop=stop).stopped:
                    print("kdbl-control: crawl stopped; run it again to go on", file=sys.stderr)
                    return stop.exit_code
            read = compose.extract_entities(db, stop=stop, progress=entity_progress(settings.progress_interval_s))
            if read:
                print(f"kdbl-control: named entities read from {read} files", file=sys.stderr)
    finally:
        indexer.close()
    return 0
