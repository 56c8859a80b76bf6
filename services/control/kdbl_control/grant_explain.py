"""`kdbl-control grant explain`: whether a principal may read one file, and what decides it.

The paths row-level security allows (migration 0023's `files` policy), in its order: the source seen whole
(open to the tenant, or granted whole), a grant naming the file (or the archive it is a member of), the
share's permissions (the file's permission set: each check and the entry that decides it for the
principal's subjects). The verdict on the share's permissions is the database's own `kdbl_rules_allow`,
the function the policy calls; the entries shown come from kdbl_core.access.share_acl's reading of the same rules.
"""

from __future__ import annotations

import uuid
from typing import Any

from kdbl_core.access import share_acl
from kdbl_core.access.principal import Principal
from kdbl_core.db.connect import Pool
from kdbl_core.errors import NotFound

_FILE = """
SELECT s.tenant_id, s.acl_mode, f.id, f.key, f.parent_id, p.key AS parent_key,
       coalesce(f.permission_set, p.permission_set) AS permission_set, ps.rules,
       kdbl_rules_allow(ps.rules, CAST(%(subjects)s AS text[])) AS rules_allow
  FROM sources s
  JOIN files f ON f.source_id = s.id AND f.key = %(key)s
  LEFT JOIN files p ON p.id = f.parent_id
  LEFT JOIN permission_sets ps ON ps.id = coalesce(f.permission_set, p.permission_set)
 WHERE s.id = %(source)s
"""
_GRANTS = """
SELECT id, file_key, subject FROM grants
 WHERE source_id = %(source)s AND subject = ANY (CAST(%(subjects)s AS text[]))
   AND (file_key IS NULL OR file_key = %(key)s OR file_key = %(parent_key)s)
 ORDER BY id
"""


def subjects_of(principal: str, groups: list[str]) -> list[str]:
    subject = principal if principal.startswith("user:") else f"user:{principal}"
    return Principal(tenant_id=uuid.UUID(int=0), tenant_name="-", subject=subject, groups=tuple(groups)).subjects


def explain(db: Pool, source_id: uuid.UUID, key: str, principal: str, groups: list[str]) -> dict[str, Any]:
    subjects = subjects_of(principal, groups)
    with db.connection() as conn:
        row = conn.execute(_FILE, {"source": source_id, "key": key, "subjects": subjects}).fetchone()
        if row is None:
            raise NotFound(f"source {source_id} has no file {key!r} (keys as `source files --status ok` lists them)")
        grants = conn.execute(_GRANTS, {"source": source_id, "subjects": subjects, "key": key,
                                        "parent_key": row.parent_key}).fetchall()
    reasons: list[str] = []
    if row.acl_mode == "tenant":
        reasons.append("the source is open to the whole tenant (permissions: tenant)")
    for g in grants:
        what = "the whole source" if g.file_key is None else (
            "this file" if g.file_key == key else f"the file it is a member of ({g.file_key})")
        reasons.append(f"grant {g.id} gives {g.subject} {what}")
    share: dict[str, Any] | None = None
    if row.acl_mode == "source":
        if row.rules is None:
            share = {"permission_set": None, "allows": False,
                     "why": "no permission set yet: the file was indexed before the source took its permissions "
                            "from the share; the next crawl sets it"}
        else:
            rules = share_acl.from_json(row.rules)
            checks = [{"check": [f"{'allow' if a else 'deny'} {s}" for s, a in check],
                       "decided_by": (None if entry is None else f"{'allow' if entry[1] else 'deny'} {entry[0]}")}
                      for check, entry in share_acl.deciding(rules, subjects)]
            share = {"permission_set": row.permission_set, "allows": bool(row.rules_allow), "checks": checks}
            if row.rules_allow:
                reasons.append(f"the share's permissions allow it (permission set {row.permission_set})")
    return {"source": str(source_id), "file": key, "subjects": subjects,
            "permissions": share_acl.PERMISSIONS_OF_MODE.get(row.acl_mode, row.acl_mode),
            "readable": bool(reasons), "because": reasons, "share": share}


def render(report: dict[str, Any]) -> str:
    lines = [f"{report['file']} ({report['permissions']} permissions) for {', '.join(report['subjects'])}: "
             f"{'READABLE' if report['readable'] else 'NOT readable'}"]
    lines += [f"  because {reason}" for reason in report["because"]]
    share = report["share"]
    if share is not None:
        if "checks" not in share:
            lines.append(f"  share: {share['why']}")
        for n, check in enumerate(share.get("checks", []), 1):
            decided = check["decided_by"] or "nothing matches (denied)"
            lines.append(f"  share check {n}: {'; '.join(check['check']) or '(no entry: nobody)'} -> {decided}")
    if not report["readable"] and share is None:
        lines.append("  no grant names this principal, its groups, the file or its source")
    return "\n".join(lines)
