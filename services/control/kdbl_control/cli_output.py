"""How kdbl-control commands print: rows as a table or `--json`, a report as its rendering or `--json`."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any


def print_rows(args: argparse.Namespace, rows: Any, columns: list[str] | None = None) -> None:
    """`--json`: the rows as JSON; else a dict as `key: value` lines, a list as a table of `columns`
    (default: the first row's keys; cells cut at 60 characters), no rows as `(none)`."""
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return
    if isinstance(rows, dict):
        for key, value in rows.items():
            print(f"{key}: {value}")
        return
    if not rows:
        print("(none)")
        return
    columns = columns or list(rows[0].keys())
    widths = {c: min(60, max(len(c), *(len(str(r.get(c, ""))) for r in rows))) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for row in rows:
        print("  ".join(str(row.get(c, ""))[:60].ljust(widths[c]) for c in columns))


def print_report(args: argparse.Namespace, report: dict[str, Any], render: Callable[[dict[str, Any]], str]) -> None:
    """`--json`: the report as indented JSON; else `render(report)`'s text."""
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
