"""`kdbl-control source files`: what a crawl made of each file, and why a file is not searchable.

An admin pointing K-Lake at a real share wants to know which files ended `ok` and, for the others, the
reasons grouped ("unsupported format (application/x-foo)": 120 files, "encrypted/password-protected":
3 files ...) with a few example keys each, without reading thousands of rows. `--status failed` (or
skipped, partial, ok) lists the files themselves. Runs on the owner connection (admin), like the other
`source` commands; members of archives and e-mails (keys `parent!/member`) are counted like files.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter, defaultdict
from typing import Any

from psycopg.rows import dict_row

from kdbl_core.db.connect import Pool

STATUSES = ("ok", "partial", "failed", "skipped", "pending")
EXAMPLES = 3
# Numbers, quoted names and sizes make every reason unique; grouping folds them into one pattern.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def reason_group(reason: str | None) -> str:
    """A reason with its specifics (numbers, quoted names) folded, so equal causes count together."""
    if not reason:
        return "(no reason)"
    return _NUMBER.sub("N", _QUOTED.sub("'…'", reason))[:200]


def _rows(db: Pool, source_id: uuid.UUID | None, tenant: str | None,
          status: str | None) -> list[dict[str, Any]]:
    sql = """
        SELECT t.name AS tenant, s.name AS source, f.key, f.status, f.status_reason AS reason,
               f.content_type, f.size, f.chunk_count AS chunks
          FROM files f JOIN sources s ON s.id = f.source_id JOIN tenants t ON t.id = f.tenant_id
         WHERE true"""
    params: dict[str, Any] = {}
    if source_id is not None:
        sql += " AND f.source_id = %(sid)s"
        params["sid"] = source_id
    if tenant is not None:
        sql += " AND t.name = %(tenant)s"
        params["tenant"] = tenant
    if status is not None:
        sql += " AND f.status = %(status)s"
        params["status"] = status
    with db.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(sql + " ORDER BY t.name, s.name, f.key", params).fetchall()


def summary(db: Pool, *, source_id: uuid.UUID | None = None, tenant: str | None = None) -> dict[str, Any]:
    """Counts per status, the share that is `ok`, and the reasons of the others grouped with examples."""
    rows = _rows(db, source_id, tenant, None)
    counts = Counter(r["status"] for r in rows)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for row in rows:
        if row["status"] != "ok":
            groups[(row["status"], reason_group(row["reason"]))].append(row["key"])
    reasons = [
        {"status": status, "reason": reason, "files": len(keys), "examples": keys[:EXAMPLES]}
        for (status, reason), keys in sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
    ]
    total = len(rows)
    return {
        "files": total,
        "by_status": {s: counts.get(s, 0) for s in STATUSES if counts.get(s, 0)},
        "ok_share": round(counts.get("ok", 0) / total, 4) if total else None,
        "reasons": reasons,
    }


def listing(db: Pool, *, status: str, source_id: uuid.UUID | None = None,
            tenant: str | None = None) -> list[dict[str, Any]]:
    return _rows(db, source_id, tenant, status)


def render(report: dict[str, Any]) -> str:
    """The summary as text for a terminal."""
    lines = [f"{report['files']} files: " + ", ".join(f"{n} {s}" for s, n in report["by_status"].items())]
    if report["ok_share"] is not None:
        lines[0] += f" ({report['ok_share']:.1%} ok)"
    for group in report["reasons"]:
        lines.append(f"  {group['files']:>6}  {group['status']:<8} {group['reason']}")
        lines.extend(f"          e.g. {key}" for key in group["examples"])
    return "\n".join(lines)
