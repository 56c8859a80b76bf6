"""Checkpoints in long computations, where a serving process may let other calls run first.

A search with limit 100, an extractive answer or a long find_similar spends tens of milliseconds in
Python between two database round trips: assembling windows and snippets, scoring sentences. One API
process runs every call on one event loop, so a quiet tenant's short search waited behind such a step
of another tenant's call however few of them ran (the quiet tenant's p95 stayed ~4x its p95 alone with
its neighbour held to one call at a time: docs/benchmarks.md, "fair share").

Core code calls `checkpoint()` between slices of such work. Outside a serving process it only yields to
the event loop; the API sets a pacer per call (kdbl_api.fair_share: a tenant that has used this process
more than another one that is waiting lets that one's call go first, for a bounded time).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token

Pacer = Callable[[], Awaitable[None]]

_pacer: ContextVar[Pacer | None] = ContextVar("kdbl_pacer", default=None)


async def checkpoint() -> None:
    """A point where other calls may run first (see the module docstring)."""
    pacer = _pacer.get()
    if pacer is None:
        await asyncio.sleep(0)
    else:
        await pacer()


def use(pacer: Pacer) -> Token[Pacer | None]:
    """This context's calls pace with `pacer` (until `reset` with the returned token)."""
    return _pacer.set(pacer)


def reset(token: Token[Pacer | None]) -> None:
    _pacer.reset(token)


__all__ = ["Pacer", "checkpoint", "reset", "use"]
