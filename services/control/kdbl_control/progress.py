"""Crawl with a progress line on a terminal (plain summary otherwise)."""

from __future__ import annotations

import sys

from kdbl_worker.pipeline import CrawlStats, Indexer, SourceRow


def crawl_with_progress(indexer: Indexer, source: SourceRow) -> CrawlStats:
    tty = sys.stderr.isatty()

    def show(stats: CrawlStats, key: str) -> None:
        if tty:
            sys.stderr.write(f"\r  {stats.listed} files ({stats.indexed} indexed, {stats.unchanged} unchanged) "
                             f"{key[-50:]:<50}")
            sys.stderr.flush()

    stats = indexer.crawl(source, progress=show)
    if tty:
        sys.stderr.write("\r" + " " * 110 + "\r")
    print(f"source {source.id}: {stats.listed} files listed, {stats.indexed} indexed, {stats.unchanged} unchanged, "
          f"{stats.deleted} deleted, {stats.failed} failed, {stats.chunks} chunks in {stats.seconds:.1f}s",
          file=sys.stderr)
    for where, why in stats.problems[:20]:
        print(f"  problem: {where}: {why}", file=sys.stderr)
    return stats
