"""Where an MCP call reads, and where its audit row is written (issue 32; docs/scaling.md §1.2-1.4).

Without KDBL_DATABASE_READ_URL a call is what it always was: one RLS transaction on the primary, its audit row
the last statement, sent with the COMMIT. With it, the call's RLS transaction opens on the read pool (a
streaming replica), and:

- **bounded staleness**: the replica's replayed WAL position comes with the BEGIN (no round trip of its own,
  kdbl_core.db.replica); a replica that has not replayed what the primary had KDBL_READ_MAX_LAG_S ago is not
  read, and the call runs on the primary instead (`lag`). A search cursor cut from a later index state than
  the replica's (paging: ReadBehind) also runs on the primary (`behind`): a lagging replica is "behind", not
  "stale".
- **every call audited on the primary**: once the handler has its result, the read transaction's COMMIT (on
  the replica) and the audit row's transaction (on the primary: BEGIN, principal, INSERT, COMMIT in one
  pipeline) go out together; the result leaves only after the audit row committed. The primary down: the
  audit fails and the call answers UNAVAILABLE with `Retry-After` (the front door, whose token lookup is on
  the primary, answers HTTP 503 first). A failed read is audited on the primary as every failure is.
- **fallbacks**: the replica unreachable or its connection lost (`unavailable`), or a query cancelled by a
  recovery conflict (SQLSTATE 40001 / 40P01: `conflict`), runs the call once on the primary — except a
  streamed answer that already sent progress, which fails as before. Each fallback is counted in /metrics
  (`kdbl_read_fallbacks_total{reason}`) and the last ones are in /readyz.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from psycopg.errors import DeadlockDetected, SerializationFailure

from kdbl_api import audit
from kdbl_api.deadlines import bounded_transaction
from kdbl_api.observability import Observability
from kdbl_core.access.principal import Principal
from kdbl_core.db import replica
from kdbl_core.db.async_pool import AsyncPool, Connection, Statement
from kdbl_core.errors import InvalidArgument, ReadBehind, Unavailable
from kdbl_core.search.paging import STALE

# the call's work in its transaction: (connection, the opening statement answered with BEGIN) -> (result, facts)
Body = Callable[[Connection, Statement | None], Awaitable[tuple[Any, audit.AuditFacts]]]
AUDIT_UNAVAILABLE = "the audit row could not be written on the primary database; the result was not sent"


class ReadRoute:
    """The primary pool, the optional read pool, the lag bound and the fallbacks' counts."""

    def __init__(self, primary: AsyncPool, reads: AsyncPool | None, *, max_lag_s: float,
                 observability: Observability) -> None:
        self.primary = primary
        self.reads = reads
        self.bound = replica.LagBound(max_lag_s) if reads is not None else None
        self._observability = observability
        self._poller: asyncio.Task[None] | None = None
        self.last_fallbacks: deque[tuple[float, str]] = deque(maxlen=20)
        self.last_replay: replica.Replay | None = None

    async def start(self) -> None:
        """Start sampling the primary's WAL position. The read pool opens at its first call (a replica down at
        start-up only sends the calls to the primary)."""
        if self.bound is not None:
            self._poller = asyncio.get_running_loop().create_task(replica.poll(self.primary.fetch, self.bound))

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        if self.reads is not None:
            await self.reads.close()

    def _fallback(self, reason: str) -> None:
        self._observability.read_fallbacks.labels(reason).inc()
        self.last_fallbacks.append((time.time(), reason))

    async def run(self, principal: Principal, *, tool: str, deadline_ms: int, extra_s: float,
                  opened: Statement | None, body: Body,
                  row_of: Callable[[audit.AuditFacts], dict[str, Any]], rerunnable: Callable[[], bool],
                  on_exceeded: Callable[[str], None]) -> Any:
        """The call's result, read where this route says and audited on the primary (module docstring).
        `opened`: the call's opening statement (sent with each attempt's BEGIN, a fresh copy each time)."""
        if self.reads is not None:
            try:
                return await self._on_replica(principal, tool, deadline_ms, extra_s, _fresh(opened), body, row_of,
                                              on_exceeded)
            except ReadBehind as exc:
                self._fallback(exc.reason)
            except _ReplicaFailed as exc:
                if isinstance(exc.__cause__, (SerializationFailure, DeadlockDetected)):
                    if not rerunnable():
                        raise exc.__cause__ from None
                    self._fallback("conflict")
                else:
                    self._fallback("unavailable")
        try:
            return await self._on_primary(principal, tool, deadline_ms, extra_s,
                                          opened if self.reads is None else _fresh(opened), body, row_of, on_exceeded)
        except ReadBehind:  # the primary itself is behind the cursor (a failover to a lagging standby)
            raise InvalidArgument("cursor", STALE) from None

    async def _on_primary(self, principal: Principal, tool: str, deadline_ms: int, extra_s: float,
                          opened: Statement | None, body: Body,
                          row_of: Callable[[audit.AuditFacts], dict[str, Any]],
                          on_exceeded: Callable[[str], None]) -> Any:
        async with bounded_transaction(self.primary, principal, tool=tool, deadline_ms=deadline_ms, also=opened,
                                       extra_s=extra_s, on_exceeded=on_exceeded) as conn:
            result, facts = await body(conn, opened)
            await audit.write(conn, row_of(facts))  # the last statement, sent with the COMMIT
        return result, facts

    async def _on_replica(self, principal: Principal, tool: str, deadline_ms: int, extra_s: float,
                          opened: Statement | None, body: Body,
                          row_of: Callable[[audit.AuditFacts], dict[str, Any]],
                          on_exceeded: Callable[[str], None]) -> Any:
        assert self.reads is not None and self.bound is not None
        replay = replica.Replay()
        pending: asyncio.Future[None] | None = None
        outcome: tuple[Any, audit.AuditFacts] | None = None
        try:
            async with bounded_transaction(self.reads, principal, tool=tool, deadline_ms=deadline_ms, also=opened,
                                           extra_s=extra_s, on_exceeded=on_exceeded, replay=replay) as conn:
                self.last_replay = replay
                if not self.bound.fresh(replay):
                    raise ReadBehind(f"the replica is more than {self.bound.max_lag_s:g} s behind the primary",
                                     reason="lag")
                outcome = await body(conn, opened)
                # the audit row's transaction on the primary, while the read transaction commits here
                pending = asyncio.ensure_future(audit.write_alone(self.primary, principal, row_of(outcome[1]),
                                                                  must=True))
        except ReadBehind:
            raise
        except (Unavailable, SerializationFailure, DeadlockDetected) as exc:
            if pending is None:  # the read failed: nothing was audited yet, the primary reads it again
                raise _ReplicaFailed() from exc
            # the read-only transaction's COMMIT failed after the read completed: the result stands
        except BaseException:
            if pending is not None:
                pending.cancel()
            raise
        assert pending is not None and outcome is not None
        try:
            await pending
        except Exception as exc:
            raise Unavailable(AUDIT_UNAVAILABLE) from exc
        return outcome

    def describe(self) -> dict[str, Any]:
        """/readyz's view: where calls read, the replica's last seen lag, the recent fallbacks."""
        if self.reads is None or self.bound is None:
            return {"reads": "primary"}
        lag = self.bound.lag_s(self.last_replay) if self.last_replay is not None else None
        return {"reads": "replica", "max_lag_s": self.bound.max_lag_s, "replica_lag_s": lag,
                "recent_fallbacks": [{"at": round(at, 3), "reason": why} for at, why in self.last_fallbacks]}


def _fresh(opened: Statement | None) -> Statement | None:
    """The opening statement for one more attempt (its rows are filled by that attempt's BEGIN)."""
    return dataclasses.replace(opened, rows=None) if opened is not None else None


class _ReplicaFailed(Exception):
    """The read on the replica failed before anything was audited (its cause says how)."""
