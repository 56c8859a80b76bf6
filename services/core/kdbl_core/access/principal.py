"""Who is calling, and the database transactions scoped to them.

Row-level security reads two settings, `kdbl.tenant_id` and `kdbl.subjects` (SET LOCAL: they vanish at
COMMIT/ROLLBACK, before the connection goes back to its pool). `rls_transaction` opens one for a
principal on the request path's AsyncPool (BEGIN and the settings in one round trip);
`tenant_transaction` one for a tenant on a worker's sync pool (no subjects: the worker writes a
tenant's content, it reads nothing on anyone's behalf).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from uuid import UUID

from psycopg_pool import ConnectionPool

from kdbl_core.access.share_acl import is_sid
from kdbl_core.db.async_pool import AsyncPool, Statement
from kdbl_core.db.async_pool import Connection as AsyncConnection
from kdbl_core.db.connect import Connection
from kdbl_core.db.replica import Replay

SCOPE_SEARCH = "kdbl.search"
SCOPE_READ = "kdbl.read"
ALL_SCOPES = (SCOPE_SEARCH, SCOPE_READ)


@dataclass(frozen=True, slots=True)
class Principal:
    tenant_id: UUID
    tenant_name: str
    subject: str  # 'user:<name>'
    groups: tuple[str, ...] = ()
    scopes: frozenset[str] = field(default_factory=frozenset)
    token_id: UUID | None = None

    @property
    def subjects(self) -> list[str]:
        """The subject plus one 'group:<name>' entry per group: what grants and the share's permissions
        (kdbl_core.access.share_acl) are matched against. A subject or group claim that is a Windows SID
        (an AD-backed identity provider's `groups` claim, e.g.) also matches SMB access lists as 'sid:S-...'."""
        subjects = [self.subject, *(f"group:{g}" for g in self.groups)]
        name = self.subject.partition(":")[2]
        subjects += [f"sid:{v}" for v in (name, *self.groups) if is_sid(v)]
        return subjects


_SUBJECT_SEP = "\x1f"
_SET_PRINCIPAL = ("SELECT set_config('kdbl.tenant_id', %(tenant)s, true), "
                  "set_config('kdbl.subjects', %(subjects)s, true)")
# the same, with the call's deadline as SET LOCAL statement_timeout (one statement, no round trip more)
_SET_PRINCIPAL_AND_TIMEOUT = _SET_PRINCIPAL + ", set_config('statement_timeout', %(timeout)s, true)"


def principal_params(principal: Principal) -> dict[str, str]:
    for subject in principal.subjects:
        if _SUBJECT_SEP in subject:
            raise ValueError("subject contains a separator character")
    return {"tenant": str(principal.tenant_id), "subjects": _SUBJECT_SEP.join(principal.subjects)}


@asynccontextmanager
async def rls_transaction(pool: AsyncPool, principal: Principal, *, also: Statement | None = None,
                          statement_timeout_ms: int | None = None, replay: Replay | None = None
                          ) -> AsyncIterator[AsyncConnection]:
    """One transaction scoped to `principal` (row-level security reads `kdbl.tenant_id` and
    `kdbl.subjects`; SET LOCAL: they vanish at COMMIT/ROLLBACK). The settings travel with BEGIN in one
    round trip, and `also` (the call's first statement, under RLS already) with them. With
    `statement_timeout_ms`, every statement of the transaction (`also` too) is cancelled by the server
    past it (SET LOCAL statement_timeout: psycopg.errors.QueryCanceled; the connection stays usable).
    Yields psycopg's AsyncConnection: `%(name)s` SQL, named-tuple rows."""
    params = principal_params(principal)
    sql = _SET_PRINCIPAL
    if statement_timeout_ms is not None:
        sql, params = _SET_PRINCIPAL_AND_TIMEOUT, {**params, "timeout": str(int(statement_timeout_ms))}
    async with pool.transaction(sql, params, also=also, replay=replay) as conn:
        yield conn


_SET_TENANT = "SELECT set_config('kdbl.tenant_id', %s, true) AS t, set_config('kdbl.subjects', '', true) AS s"


@contextmanager
def tenant_transaction(pool: ConnectionPool, tenant_id: UUID) -> Iterator[Connection]:
    """A worker transaction limited to one tenant's rows (row-level security reads `kdbl.tenant_id`;
    SET LOCAL: the setting vanishes at COMMIT/ROLLBACK, before the connection goes back to the pool)."""
    with pool.connection() as conn:
        conn.execute(_SET_TENANT, (str(tenant_id),))
        yield conn
