"""Member keys that a listed file already has: a real folder named like a container plus `!`.

A member's key is its container's key + `!/` + its path (`c.zip!/notes.md`), and member paths never
hold a part ending in `!` (extract/containers.py), so members never collide with each other. A share may
still hold a real folder `c.zip!` beside `c.zip`: its file `c.zip!/notes.md` is listed under the very key
the member would get. One row per key, so one of them must give way, and it must not depend on which
of the two was written first. The rule: **the listed file keeps the key, always; the member is not
indexed, and its container says so** (`partial`, naming the member, the key and the folder).

- `settle`, before a container is written: its members whose keys a listed file of the source holds
  (a row without a parent), or that this run lists (queued, maybe not written yet), are left out with
  what they hold, and the container's status and reason say which;
- `settle`, before a listed file whose key has `!/` is written: when a member of an unchanged container
  holds that key (the folder appeared after the container was indexed), the listed file takes the row
  over (kdbl_core.content.store's upsert does) and the container is marked `partial` with the reason in
  the same transaction.
The member comes back when its container is indexed again after the folder is gone (when the container
changes: a crawl does not re-read an unchanged file).

One indexed query per container file with members (`key = ANY(...)` on (source_id, key)), none for other
files: the write path's cost is unchanged for files that are neither.
"""

from __future__ import annotations

from collections.abc import Sequence

from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import store
from kdbl_core.content.store import Statement
from kdbl_core.db.connect import Pool
from kdbl_worker import jobs
from kdbl_worker.extract.containers import MEMBER_SEP

_EXAMPLES = 5  # collisions named one by one in the reason, then counted

_TAKEN = """
SELECT key FROM files WHERE source_id = %(s)s AND parent_id IS NULL AND key = ANY(%(keys)s)
UNION
SELECT key FROM crawl_items WHERE job_id = %(job)s AND key = ANY(%(keys)s)
"""

_HOLDER = """
SELECT p.key AS container FROM files m JOIN files p ON p.id = m.parent_id
 WHERE m.source_id = %(s)s AND m.key = %(key)s
"""

# the container of a member whose key a listed file takes over: `partial`, with the reason (same transaction)
_MARK = """
UPDATE files SET status = CASE WHEN status = 'ok' THEN 'partial' ELSE status END,
                 status_reason = left(concat_ws('; ', status_reason, CAST(%(note)s AS text)), 2000)
 WHERE source_id = %(s)s AND key = %(container)s AND parent_id IS NULL
"""


def note(container: str, key: str) -> str:
    """The reason a container gives for a member whose key a listed file holds."""
    folder = key.rpartition(MEMBER_SEP)[0] + "!"
    return (f"member {key[len(container) + len(MEMBER_SEP):]} not indexed: its key {key} is a listed file "
            f"of the share (in a real folder {folder}), which keeps it")


def settle(pool: Pool, item: jobs.ItemClaim, members: Sequence[store.MemberFile], status: str,
           reason: str | None) -> tuple[list[store.MemberFile], str, str | None, list[Statement]]:
    """(members to write, the file's status, its reason, statements for its transaction): see above."""
    key, then = item.file.key, []
    if MEMBER_SEP in key:
        with tenant_transaction(pool, item.tenant_id) as conn:
            row = conn.execute(_HOLDER, {"s": item.source_id, "key": key}).fetchone()
        if row is not None:
            then.append((_MARK, {"s": item.source_id, "container": row.container,
                                 "note": note(row.container, key)}))
    members = list(members)
    if members:
        members, status, reason = _without_taken(pool, item, members, status, reason)
    return members, status, reason, then


def _without_taken(pool: Pool, item: jobs.ItemClaim, members: list[store.MemberFile], status: str,
                   reason: str | None) -> tuple[list[store.MemberFile], str, str | None]:
    keys = [m.meta.key for m in members]
    with tenant_transaction(pool, item.tenant_id) as conn:
        taken = {r.key for r in conn.execute(_TAKEN, {"s": item.source_id, "job": item.job_id, "keys": keys})}
    if not taken:
        return members, status, reason
    kept, dropped = [], []
    for member in members:  # parents come before their members (pipeline.member_files)
        k = member.meta.key
        if k in taken:
            dropped.append(k)
        elif not any(k.startswith(d + MEMBER_SEP) for d in dropped):  # what a left-out member holds goes too
            kept.append(member)
    notes = [note(item.file.key, k) for k in dropped[:_EXAMPLES]]
    if len(dropped) > _EXAMPLES:
        notes.append(f"... and {len(dropped) - _EXAMPLES} more members whose keys listed files hold")
    reason = "; ".join(([reason] if reason else []) + notes)[:2000]
    return kept, "partial" if status == "ok" else status, reason
