"""SIGINT/SIGTERM as a stop request: long-running commands (`crawl`, `up`) wind down within seconds.

The first signal sets a `Stop` event that the crawl honours at any point (kdbl_worker.pipeline: writes
in progress are aborted after 2 s and rolled back, unstarted work is handed back); the command then
exits 128 + the signal number. A second signal exits at once (os._exit): what was in progress is left
to the database (an open transaction rolls back) and to the queue (leases expire).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class Stop(threading.Event):
    """A stop request; `signum` is the signal that made it (None when set by code)."""

    signum: int | None = None

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGINT)


@contextmanager
def stop_on_signals(stop: Stop | None = None,
                    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[Stop]:
    """Within the block, `signals` set `stop` (the first) or exit the process (the second)."""
    stop = stop if stop is not None else Stop()
    if threading.current_thread() is not threading.main_thread():  # only the main thread may install
        yield stop
        return

    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            os._exit(128 + signum)
        stop.signum = signum
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
