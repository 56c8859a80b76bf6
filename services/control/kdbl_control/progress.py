"""Crawl progress: a live line on a terminal, and a log line every few seconds when stderr is not one.

Without a terminal (a pipe, a container log, systemd) the `\r` line is useless and nothing else would
show that a crawl is alive, so a ticker thread prints one line every KDBL_PROGRESS_INTERVAL_S (5 s):
files listed / indexed / unchanged / failed, files per second, and the file in hand — also while a
single big file is being written and no file finishes. `crawl` and `up` both crawl through here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from kdbl_control import compose

if TYPE_CHECKING:
    from kdbl_control.compose import CrawlStats, Indexer, SourceRow


def source_label(source: SourceRow) -> str:
    config = source.config or {}
    where = config.get("root") or config.get("bucket") or config.get("url") or config.get("share") or ""
    return f"{str(source.id)[:8]} {where}".strip()


def progress_line(label: str, stats: CrawlStats | None, current: str, elapsed_s: float) -> str:
    s = stats or compose.crawl_stats()
    rate = (s.indexed + s.unchanged) / elapsed_s if elapsed_s > 0 else 0.0
    return (f"kdbl: crawl {label}: {s.listed} listed, {s.indexed} indexed, {s.unchanged} unchanged, "
            f"{s.failed} failed, {rate:.1f} files/s, {elapsed_s:.0f} s; now: {current[-120:] or '-'}")


class ProgressLog:
    """Prints `progress_line` every `interval_s` until stopped (a daemon thread)."""

    def __init__(self, indexer: Indexer, label: str, interval_s: float, out: TextIO) -> None:
        self.indexer, self.label, self.interval_s, self.out = indexer, label, interval_s, out
        self._done = threading.Event()
        self._started = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="kdbl-progress", daemon=True)

    def __enter__(self) -> ProgressLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._done.wait(self.interval_s):
            line = progress_line(self.label, self.indexer.local_stats, self.indexer.activity.oldest_key(),
                                 time.monotonic() - self._started)
            print(line, file=self.out, flush=True)


def queue_progress(interval_s: float, out: TextIO | None = None) -> Callable[[dict], None]:
    """For `crawl --queue`: a line every `interval_s` with the runs' totals while the workers crawl."""
    out = out or sys.stderr
    started = time.monotonic()
    last = [started]

    def show(statuses: dict) -> None:
        now = time.monotonic()
        if now - last[0] < interval_s:
            return
        last[0] = now
        runs = list(statuses.values())
        done = sum(s.indexed for s in runs) + sum(s.unchanged for s in runs)
        print(f"kdbl: crawl runs {','.join(str(s.id) for s in runs)}: {sum(s.listed for s in runs)} listed, "
              f"{sum(s.pending for s in runs)} pending, {sum(s.failed for s in runs)} failed, "
              f"{', '.join(sorted({s.state for s in runs}))}, {now - started:.0f} s; "
              f"{done / (now - started):.1f} files/s", file=out, flush=True)

    return show


def entity_progress(interval_s: float, out: TextIO | None = None) -> Callable[[int], None]:
    """For the entity stage after a crawl: a line every `interval_s` with the files read so far."""
    out = out or sys.stderr
    started = time.monotonic()
    last = [started]

    def show(files: int) -> None:
        now = time.monotonic()
        if now - last[0] >= interval_s:
            last[0] = now
            print(f"kdbl: named entities: {files} files read, {now - started:.0f} s; "
                  f"{files / (now - started):.1f} files/s", file=out, flush=True)

    return show


def crawl_with_progress(indexer: Indexer, source: SourceRow, *, stop: threading.Event | None = None,
                        out: TextIO | None = None) -> CrawlStats:
    """Crawl `source` (until done or `stop`), showing progress on `out` (stderr); its statistics."""
    out = out or sys.stderr
    tty = out.isatty()

    def show(stats: CrawlStats, key: str) -> None:
        out.write(f"\r  {stats.listed} files ({stats.indexed} indexed, {stats.unchanged} unchanged) "
                  f"{key[-50:]:<50}")
        out.flush()

    label = source_label(source)
    if tty:
        stats = indexer.crawl(source, progress=show, stop=stop)
        out.write("\r" + " " * 110 + "\r")
    else:
        with ProgressLog(indexer, label, indexer.settings.progress_interval_s, out):
            stats = indexer.crawl(source, stop=stop)
    print(f"source {source.id}: {stats.listed} files listed, {stats.indexed} indexed, {stats.unchanged} unchanged, "
          f"{stats.deleted} deleted, {stats.failed} failed, {stats.chunks} chunks in {stats.seconds:.1f}s"
          + (" (stopped before the end)" if stats.stopped else ""), file=out, flush=True)
    for where, why in stats.problems[:20]:
        print(f"  problem: {where}: {why}", file=out)
    return stats
