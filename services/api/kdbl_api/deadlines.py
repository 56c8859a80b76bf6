"""Every MCP call's deadline (issue 27 §5): its RLS transaction, bounded in the database and in Python.

Before, only abstractive generation (KDBL_CHAT_TIMEOUT_S) and request bodies (KDBL_BODY_READ_TIMEOUT_S)
were time-bounded: a call whose statement waited on a lock, or read more than expected, held its
database connection and its tenant's slot (kdbl_api.fair_share) for as long as it took.

Now `bounded_transaction` opens the call's transaction with SET LOCAL statement_timeout = the deadline
(sent with BEGIN and the principal's settings: no round trip more), so the server cancels any statement
past it; and bounds the whole block — the wait for a pooled connection, the Python work between
statements — at the deadline + GRACE_S (+ `extra_s`: `answer`'s generation, which stops itself at
KDBL_CHAT_TIMEOUT_S). The grace lets the server's cancel answer a slow statement first: that leaves the
transaction aborted and the connection idle, so the rollback returns it to the pool as it was. When the
Python bound fires mid-statement, psycopg sends the server a cancel and waits for it before the rollback,
so the connection is reusable then too (tests/integration/test_call_deadlines.py holds both cases).

Either way the caller gets DeadlineExceeded (JSON-RPC -32008) naming the deadline and what to change.
The deadline is the tenant's for the tool, else its default, else KDBL_CALL_TIMEOUT_S
(kdbl_core.access.policy.Limits).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from psycopg.errors import QueryCanceled

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.async_pool import AsyncPool, Connection, Statement
from kdbl_core.db.replica import Replay
from kdbl_core.errors import DeadlineExceeded

GRACE_S = 1.0


def exceeded(tool: str, tenant: str, deadline_ms: int) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"{tool} stopped at its deadline of {deadline_ms} ms and was rolled back; narrow the call (a smaller "
        f"limit, a shorter query, filters) or ask an administrator for a longer deadline: kdbl-control tenant "
        f"update {tenant} --timeout {tool}=<duration> (the Tenant resource's spec.deadlines)",
        deadline_ms=deadline_ms)


def _statement_timeout(exc: QueryCanceled, elapsed_s: float, deadline_ms: int) -> bool:
    """A cancel by statement_timeout, not an administrator's pg_cancel_backend: the server's message says
    so in English; under another lc_messages, the call has run for its deadline."""
    return "statement timeout" in (exc.diag.message_primary or str(exc)) or elapsed_s * 1000 >= deadline_ms


@asynccontextmanager
async def bounded_transaction(pool: AsyncPool, principal: Principal, *, tool: str, deadline_ms: int,
                              extra_s: float = 0.0, also: Statement | None = None,
                              on_exceeded: Callable[[str], None] | None = None,
                              replay: Replay | None = None) -> AsyncIterator[Connection]:
    """`rls_transaction` under the call's deadline; past it DeadlineExceeded, after `on_exceeded(where)`
    ('statement': the server cancelled one; 'call': the Python-side bound fired)."""
    bound = asyncio.timeout(deadline_ms / 1000 + GRACE_S + extra_s)
    started = time.monotonic()
    try:
        async with bound, rls_transaction(pool, principal, also=also, statement_timeout_ms=deadline_ms,
                                             replay=replay) as conn:
            yield conn
    except QueryCanceled as exc:  # rolled back; the connection is back in the pool, idle
        if not _statement_timeout(exc, time.monotonic() - started, deadline_ms):
            raise
        if on_exceeded is not None:
            on_exceeded("statement")
        raise exceeded(tool, principal.tenant_name, deadline_ms) from None
    except TimeoutError:
        if not bound.expired():
            raise
        if on_exceeded is not None:
            on_exceeded("call")
        raise exceeded(tool, principal.tenant_name, deadline_ms) from None
