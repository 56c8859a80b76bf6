"""Per-file deadlines for the worker's file writes, enforced on both ends of the connection.

A file write that never ends (a lock that is never released, the libpq pipeline deadlock of issue 12,
a network that drops packets silently) used to hold its worker, its lease and the crawl for good. Now:

- Server side (`write_pool`): the write connections run with `statement_timeout`,
  `idle_in_transaction_session_timeout` and (PostgreSQL >= 17) `transaction_timeout` set to the
  deadline, so Postgres itself ends a write blocked on a lock or a transaction left open by a stuck
  client; TCP keepalives and `tcp_user_timeout` end a TCP connection whose peer vanished.
- Client side (`Watchdog`): a write still running `grace_s` after its deadline gets its backend
  terminated (`pg_terminate_backend` of the `conn.info.backend_pid` a writer reported when it took
  its connection, sent on the worker's main pool, never on a write connection); so does every write
  still running `stop_grace_s` after the crawl was told to stop (SIGINT/SIGTERM), which is what makes
  a stop prompt even mid-commit. Postgres rolls the transaction back (or it had committed): a file is
  never half-written.

The pipeline's write is then classified by `Ticket.fired` and the error's SQLSTATE: past the deadline
the file is recorded failed with the reason and the crawl goes on; stopped, the item is handed back.
The deadline (KDBL_FILE_DEADLINE_S, default 300 s) bounds one file's whole work: its extraction
(decompression included; the sandbox's timeout is the smaller of KDBL_EXTRACT_TIMEOUT_S and the deadline),
the counting of its tokens and its write transaction, which gets what the extraction left (`watch`'s
`left_s`; the connection's server-side timeouts stay at the whole deadline, a backstop). A healthy file
therefore never goes longer than the deadline (+ grace) without progress, which is what the heartbeat's
`stall_s` allows before it lets the leases run out (kdbl_worker.queue). Measured here (2 cores): a 10 MB text file (9,784 chunks) is
extracted and written in 9.1 s (1.1 MB/s), so the default leaves ~30x headroom for that size and holds
text files of a few hundred MB; raise it for larger ones.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

log = logging.getLogger(__name__)

# statement_timeout (57014 query_canceled), idle_in_transaction_session_timeout, transaction_timeout
TIMEOUT_STATES = frozenset({"57014", "25P03", "25P04"})
DEFAULT_GRACE_S = 5.0
DEFAULT_STOP_GRACE_S = 2.0
POLL_S = 0.2  # how soon a stop is noticed


def write_pool(pool: ConnectionPool, deadline_s: float, size: int) -> ConnectionPool:
    """A pool on `pool`'s database whose connections carry the per-file deadline (see above).

    Connections are checked when taken (`check_connection`: one would otherwise be found dead by the
    file's transaction after a database restart)."""
    ms = max(1, int(deadline_s * 1000))
    with pool.connection() as conn:
        version = conn.info.server_version
    options = [f"-c statement_timeout={ms}", f"-c idle_in_transaction_session_timeout={ms}"]
    if version >= 170000:
        options.append(f"-c transaction_timeout={ms}")
    given = conninfo_to_dict(pool.conninfo).get("options")
    kwargs = {**(pool.kwargs or {}), "options": " ".join([*([given] if isinstance(given, str) else []), *options]),
              "keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10, "keepalives_count": 3,
              "tcp_user_timeout": ms}
    return ConnectionPool(pool.conninfo, min_size=1, max_size=2 * size, name=f"{pool.name}-write", open=True,
                          timeout=30.0, max_lifetime=1800.0, check=ConnectionPool.check_connection,
                          kwargs=kwargs)


@dataclass(slots=True)
class Ticket:
    item_id: int
    thread: int
    started: float
    deadline: float
    stop_at: float | None = None
    fired: str | None = None  # "deadline" | "stop": the watchdog terminated this write's backend

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class Watchdog:
    """Terminates the backend of a write past its deadline (+ `grace_s`) or, once `stop` is set, past
    `stop_grace_s`. `track` each writer thread's connection as it is taken (content.FileWriter's
    `on_checkout`): the watchdog learns the backend pid to terminate."""

    def __init__(self, pool: ConnectionPool, deadline_s: float, *, grace_s: float = DEFAULT_GRACE_S,
                 stop_grace_s: float = DEFAULT_STOP_GRACE_S,
                 on_deadline: Callable[[int], None] | None = None) -> None:
        self.pool, self.on_deadline = pool, on_deadline
        self.deadline_s, self.grace_s, self.stop_grace_s = deadline_s, grace_s, stop_grace_s
        self._pids: dict[int, int] = {}
        self._tickets: dict[int, Ticket] = {}
        self._cond = threading.Condition()
        self._stop_event: threading.Event | None = None
        self._stopped_at: float | None = None  # when the stop was first seen: every write aborts by then + grace
        self._thread: threading.Thread | None = None
        self._closed = False

    def track(self, conn: psycopg.Connection) -> None:
        """The calling writer thread writes on `conn` now."""
        self._pids[threading.get_ident()] = conn.info.backend_pid

    def stop_on(self, stop: threading.Event | None) -> None:
        """Abort writes `stop_grace_s` after `stop` is set."""
        with self._cond:
            if stop is not self._stop_event:
                self._stop_event, self._stopped_at = stop, None

    @contextmanager
    def watch(self, item_id: int, left_s: float | None = None) -> Iterator[Ticket]:
        """Watch the calling thread's write of `item_id`, due in `left_s` (default: the whole deadline;
        the pipeline passes what extraction left of the file's deadline)."""
        now = time.monotonic()
        due = now + (self.deadline_s if left_s is None else left_s)
        ticket = Ticket(item_id, threading.get_ident(), now, due)
        with self._cond:
            if self._thread is None:
                self._closed = False
                self._thread = threading.Thread(target=self._run, name="kdbl-write-watchdog", daemon=True)
                self._thread.start()
            self._tickets[item_id] = ticket
            self._cond.notify()
        try:
            yield ticket
        finally:
            with self._cond:
                self._tickets.pop(item_id, None)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            due: list[tuple[Ticket, int | None]] = []
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                stopping = self._stop_event is not None and self._stop_event.is_set()
                if stopping and self._stopped_at is None:
                    self._stopped_at = now
                for ticket in self._tickets.values():
                    if ticket.fired:
                        continue
                    if stopping and ticket.stop_at is None:
                        ticket.stop_at = self._stopped_at + self.stop_grace_s
                    if now >= ticket.deadline + self.grace_s:
                        ticket.fired = "deadline"
                    elif ticket.stop_at is not None and now >= ticket.stop_at:
                        ticket.fired = "stop"
                    if ticket.fired:
                        due.append((ticket, self._pids.get(ticket.thread)))
                self._cond.wait(POLL_S if not due else 0)
            for ticket, pid in due:
                self._terminate(ticket, pid)

    def _terminate(self, ticket: Ticket, pid: int | None) -> None:
        if ticket.fired == "deadline" and self.on_deadline is not None:
            self.on_deadline(ticket.item_id)  # its lease is no longer renewed, whatever happens next
        log.warning("file write aborted", extra={"item_id": ticket.item_id, "why": ticket.fired, "pid": pid,
                                                 "elapsed_s": round(ticket.elapsed(), 1)})
        if pid is None:
            return
        try:
            with self.pool.connection() as conn:
                conn.execute("SELECT pg_terminate_backend(%(pid)s)", {"pid": pid})
        except Exception as exc:  # noqa: BLE001 - the server-side timeouts still end the write
            log.warning("could not abort a file write", extra={"pid": pid, "error": repr(exc)[:300]})
