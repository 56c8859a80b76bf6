"""`kdbl-control mcp smoke | stdio | audit`: try a K-Lake API's MCP endpoint, bridge it to stdio, read its audit."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdbl_control.cli_database import on_pool
from kdbl_control.cli_output import print_rows
from kdbl_control.cli_values import parse_time
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings

if TYPE_CHECKING:
    from kdbl_core.db.connect import Pool


def add_commands(sub: Any) -> None:
    mcp = sub.add_parser("mcp", help="the MCP endpoint: a smoke test against an API, a stdio bridge for desktop "
                         "clients, the audit trail of its calls").add_subparsers(dest="action", required=True)
    sm = mcp.add_parser("smoke", help="initialize → tools/list → tools/call against --api-url")
    sm.add_argument("--query", default="search", help="what the search_content call asks (default 'search')")
    sm.set_defaults(func=_smoke)
    ms = mcp.add_parser("stdio", help="a stdio MCP server for desktop clients, forwarding to --api-url's POST /mcp")
    ms.add_argument("--token-file", type=Path,
                    help="file holding the PAT (else KDBL_API_TOKEN_FILE, else the KDBL_API_TOKEN variable)")
    ms.set_defaults(func=_stdio)
    au = mcp.add_parser("audit", help="recent MCP calls")
    au.add_argument("--tool", help="only this tool's calls (e.g. search_content)")
    au.add_argument("--tenant", help="only this tenant's calls")
    au.add_argument("--status", choices=["ok", "error", "denied", "rate_limited", "timeout", "unauthenticated"],
                    help="only the calls that ended so")
    au.add_argument("--principal", help="user:NAME, group:NAME or NAME")
    au.add_argument("--since", type=parse_time, help="ISO time (e.g. 2026-01-31T12:00Z) or an age: 15m, 2h, 1d")
    au.add_argument("--until", type=parse_time, help="same forms as --since")
    au.add_argument("--request-id", help="one call's id (its X-Request-Id response header, meta.request_id)")
    au.add_argument("--limit", type=int, default=50, help="at most this many calls, newest first (default 50)")
    au.set_defaults(func=on_pool(_audit))


def _smoke(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control.smoke import read_token, run_smoke

    token = args.api_token or read_token(args.api_token_file or settings.api_token_file)
    if not args.api_url or not token:
        raise ConfigError("mcp smoke needs --api-url URL and --api-token-file PATH (or --api-token PAT)")
    report = asyncio.run(run_smoke(args.api_url, token, args.query))
    print_rows(args, report)
    return 0


def _stdio(args: argparse.Namespace, settings: Settings) -> int:
    """stdout is the protocol's: JSON logs go to stderr only."""
    from kdbl_control import stdio_bridge
    from kdbl_core import logging_setup

    logging_setup.configure(settings.log_level, "json")
    return stdio_bridge.serve(args.api_url, args.token_file or args.api_token_file, settings,
                              token_in_argv=args.api_token is not None)


def _audit(args: argparse.Namespace, db: Pool) -> int:
    from kdbl_control import admin

    print_rows(args, admin.audit_rows(db, tool=args.tool, tenant_name=args.tenant, status=args.status,
                                      principal=args.principal, since=args.since, until=args.until,
                                      request_id=args.request_id, limit=args.limit),
               ["ts", "request_id", "principal", "tool", "status", "row_count", "source_ids", "duration_ms",
                "client_ip", "error", "arguments"])
    return 0
