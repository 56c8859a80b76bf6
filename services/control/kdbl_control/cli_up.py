"""`kdbl-control up`: everything on this machine (embedded Postgres, a crawl, MCP on localhost)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kdbl_core.settings import Settings


def add_commands(sub: Any) -> None:
    up = sub.add_parser("up", help="run everything locally: embedded Postgres, crawl, MCP on localhost")
    up.add_argument("folders", nargs="*", type=Path, help="folders to index (default: the repo's docs/)")
    up.add_argument("--port", type=int, default=8080, help="port to serve MCP on (default 8080)")
    up.add_argument("--host", default="127.0.0.1",
                    help="address to serve on (default 127.0.0.1; 0.0.0.0 serves every interface and admits "
                         "this machine's names and addresses as Host headers; KDBL_ALLOWED_HOSTS adds more)")
    up.add_argument("--legacy-sse", action="store_true",
                    help="also serve the 2024-11-05 HTTP+SSE transport (GET /sse, POST /messages) for clients "
                         "that speak only it (KDBL_LEGACY_SSE_ENABLED)")
    up.set_defaults(func=_up)


def _up(args: argparse.Namespace, settings: Settings) -> int:
    from kdbl_control.up import run_up

    if args.legacy_sse:
        settings = settings.model_copy(update={"legacy_sse_enabled": True})
    return run_up(args.folders, (args.data_dir or Path(".kdbl")).resolve(), args.port, args.host, settings)
