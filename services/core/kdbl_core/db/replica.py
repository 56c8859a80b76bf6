"""Reading on a streaming replica within a bound (issue 32; docs/scaling.md §1.3).

A hot standby shows what the primary committed up to the WAL position it has replayed. The API reads MCP
calls there (KDBL_DATABASE_READ_URL) only while that position is recent: `LagBound` keeps the primary's WAL
position once a second (`poll`, one `pg_current_wal_lsn()` on the primary's pool) and says whether a
replica's replayed position (`pg_last_wal_replay_lsn()`, read with the read transaction's BEGIN: no round
trip of its own) has reached what the primary had `max_lag_s` ago. The check is per transaction, not per
pool: CloudNativePG's `-ro` Service spreads connections over standbys with different lags.

Before a sample `max_lag_s` old exists (the first seconds of a process) the oldest sample is the bound:
stricter, never looser. No sample at all (the primary unreachable since start): no replica is fresh, and
the calls go to the primary, which answers for itself.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
_CURRENT = "SELECT pg_current_wal_lsn()::text AS lsn"
# with a read transaction's BEGIN: where this server has replayed to (NULL on a primary: nothing to wait for)
REPLAY = "SELECT pg_is_in_recovery() AS standby, pg_last_wal_replay_lsn()::text AS lsn"


def parse_lsn(text: str | None) -> int | None:
    """A pg_lsn's text ('16/B374D848') as a number (bytes of WAL), None for NULL."""
    if text is None:
        return None
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass(slots=True)
class Replay:
    """Filled by a read transaction's opening round trip: whether the server is a standby, and its position."""

    standby: bool = False
    lsn: int | None = None


class LagBound:
    """The primary's recent WAL positions, and whether a replayed position is within `max_lag_s` of them."""

    def __init__(self, max_lag_s: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_lag_s = max_lag_s
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, lsn: int, at: float | None = None) -> None:
        at = self._clock() if at is None else at
        self._samples.append((at, lsn))
        # keep one sample older than the bound (the one `required` answers with), drop the rest of the old
        while len(self._samples) > 2 and self._samples[1][0] <= at - self.max_lag_s:
            self._samples.popleft()

    def required(self, now: float | None = None) -> int | None:
        """The position a replica must have replayed: the primary's `max_lag_s` ago (the newest sample at or
        before then; before one is that old, the oldest). None: no sample yet."""
        if not self._samples:
            return None
        now = self._clock() if now is None else now
        found = self._samples[0][1]
        for at, lsn in self._samples:
            if at > now - self.max_lag_s:
                break
            found = lsn
        return found

    def fresh(self, replay: Replay, now: float | None = None) -> bool:
        """Whether a transaction that opened at `replay` may be read: a primary always; a standby when it has
        replayed what the primary had `max_lag_s` ago."""
        if not replay.standby:
            return True
        needed = self.required(now)
        return needed is not None and replay.lsn is not None and replay.lsn >= needed

    def lag_s(self, replay: Replay, now: float | None = None) -> float | None:
        """How far behind `replay` is, in seconds of the primary's samples (0: at the newest; None: unknown)."""
        if not replay.standby:
            return 0.0
        if replay.lsn is None or not self._samples:
            return None
        now = self._clock() if now is None else now
        if replay.lsn >= self._samples[-1][1]:
            return 0.0
        reached = [at for at, lsn in self._samples if lsn <= replay.lsn]
        return round(now - reached[-1], 3) if reached else round(now - self._samples[0][0], 3)


async def poll(fetch: Callable[[str], object], bound: LagBound, *, interval_s: float = POLL_INTERVAL_S) -> None:
    """Sample the primary's WAL position every `interval_s` until cancelled (`fetch`: the primary pool's
    one-statement fetch). A failed sample is skipped: the bound then ages, and replicas stop being fresh."""
    while True:
        try:
            rows = await fetch(_CURRENT)  # type: ignore[misc]
            lsn = parse_lsn(rows[0].lsn) if rows else None
            if lsn is not None:
                bound.add(lsn)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the primary restarting or down: its own requests say so
            log.debug("primary WAL position not sampled", extra={"error": type(exc).__name__})
        await asyncio.sleep(interval_s)
