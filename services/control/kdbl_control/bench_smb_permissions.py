"""`kdbl-control bench smb-permissions`: what reading NT ACLs costs a listing of a real SMB share (issue 30).

Three listings of the same folder with the worker's own connector, each `runs` times (the median kept):

- `walk`: the listing alone (names, sizes, times) — what a crawl of a source open to its tenant lists;
- `walk(access=True)`: each file's security descriptor read too (one compound CREATE + QUERY_INFO + CLOSE
  a file, SD_WINDOW in flight) — `permission_checks: every-crawl`, every crawl of a from-source source;
- `walk(access=True, skip_access=...)`: with the change times of the previous listing, as a re-crawl of an
  unchanged share with `permission_checks: changed` lists (no descriptor read).

Reported: files/s, SMB messages a file (message ids taken on the connector's connections) and the client's CPU
seconds. Needs a share the given account can list and read the descriptors of.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from kdbl_control import compose
from kdbl_core.access.share_acl import UNCHANGED


def _messages(connector: Any) -> int:
    """Message ids taken so far on the smb connector's connections (each message takes one here)."""
    return sum(c.sequence_window["low"] for c in connector._pool.values())


def _one(config: dict[str, Any], **walk: Any) -> tuple[float, float, int, list]:
    """(wall seconds, client CPU seconds, messages, files) of one listing on a fresh connection."""
    with compose.connector("smb", config) as connector:
        connector.check()
        before = _messages(connector)
        cpu, wall = time.process_time(), time.perf_counter()
        files = list(connector.walk(**walk))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        return wall, cpu, _messages(connector) - before, files


def walk_costs(config: dict[str, Any], *, runs: int = 3) -> dict[str, Any]:
    """The three listings' medians (module docstring) over `runs` runs each."""
    stamps: dict[str, str | None] = {}
    rows: dict[str, Any] = {}
    for mode in ("walk", "walk_access", "walk_access_unchanged"):
        walls, cpus, messages, files = [], [], 0, []
        for _ in range(runs):
            walk: dict[str, Any] = {} if mode == "walk" else {"access": True}
            if mode == "walk_access_unchanged":
                walk["skip_access"] = lambda key, stamp: stamps.get(key) == stamp
            wall, cpu, messages, files = _one(config, **walk)
            walls.append(wall)
            cpus.append(cpu)
        if mode == "walk_access":
            stamps = {f.key: f.access_stamp for f in files}
        n = max(len(files), 1)
        wall = statistics.median(walls)
        rows[mode] = {"files": len(files), "seconds": round(wall, 3), "files_per_s": round(len(files) / wall, 1),
                      "messages_per_file": round(messages / n, 2), "client_cpu_ms_per_file":
                      round(1000 * statistics.median(cpus) / n, 3),
                      "descriptors_read": sum(1 for f in files if f.access not in (None, UNCHANGED))}
    base = rows["walk"]["files_per_s"]
    for mode in ("walk_access", "walk_access_unchanged"):
        rows[mode]["of_walk"] = round(rows[mode]["files_per_s"] / base, 3) if base else None
    rows["runs"] = runs
    rows["date"] = time.strftime("%Y-%m-%d %H:%M")
    rows["load_average"] = round(os.getloadavg()[0], 2)
    return rows


def summarise(result: dict[str, Any]) -> str:
    lines = [f"SMB listing of {result['walk']['files']} files, median of {result['runs']} runs; load average "
             f"{result['load_average']}",
             f"{'listing':<44}{'files/s':>10}{'of walk':>9}{'messages/file':>15}{'client CPU ms/file':>20}"]
    names = {"walk": "walk (no permissions)", "walk_access": "walk(access=True): every-crawl",
             "walk_access_unchanged": "walk(access, unchanged change times): changed"}
    for mode, name in names.items():
        r = result[mode]
        share = f"{100 * r['of_walk']:.0f} %" if r.get("of_walk") is not None else "-"
        lines.append(f"{name:<44}{r['files_per_s']:>10}{share:>9}{r['messages_per_file']:>15}"
                     f"{r['client_cpu_ms_per_file']:>20}")
    return "\n".join(lines)
