"""`kdbl-api`: serve MCP over Streamable HTTP as the non-owner kdbl_api database role.

Each process listens on the API port and, unless KDBL_METRICS_PORT is 0, on the metrics port (one
app serves both; kdbl_api.observability.MetricsPort tells them apart). uvicorn's own proxy-header
handling is off: it believes X-Forwarded-For from 127.0.0.1 by default (or from $FORWARDED_ALLOW_IPS),
so any local process could put an address of its choice into audit rows. The app believes only
KDBL_TRUSTED_PROXIES (kdbl_api.app).
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import uvicorn
from starlette.applications import Starlette

from kdbl_api import workers
from kdbl_api.app import create_app
from kdbl_core import logging_setup
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings, get_settings, load_settings

# uvicorn options of every kdbl-api process (and of anything else serving create_app's app)
# access_log off: each call's own log line ("mcp call": request id, tool, status, took_ms) says more, and
# uvicorn's line was silenced anyway (kdbl_core.logging_setup) after building its arguments on every request
SERVER_OPTIONS: dict[str, Any] = {"log_config": None, "proxy_headers": False, "server_header": False,
                                  "access_log": False}


def build() -> Starlette:
    """The app from the environment (also the uvicorn factory each worker process calls)."""
    settings = get_settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    read_url = settings.database_read_url.get_secret_value() if settings.database_read_url else None
    return create_app(settings, settings.require_database_url(), read_url=read_url)  # reads: a replica, if any


def listen_sockets(settings: Settings) -> list[socket.socket]:
    """The API port's socket and the metrics port's (bound, not listening: see workers.bound_socket)."""
    return [workers.bound_socket(settings.api_host, port) for port in workers.listen_ports(settings)]


def main() -> None:
    settings = load_settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    try:
        settings.require_database_url()
        if settings.metrics_port == settings.api_port:
            raise ConfigError("KDBL_METRICS_PORT must differ from KDBL_API_PORT (or be 0: no metrics)")
        if settings.legacy_sse_enabled and settings.api_workers > 1:  # the kernel spreads POSTs over processes
            raise ConfigError("KDBL_LEGACY_SSE_ENABLED needs KDBL_API_WORKERS=1: an SSE session lives in one "
                              "process and its POST /messages must reach that process")
    except ConfigError as exc:
        print(f"kdbl-api: {exc.message}", file=sys.stderr)
        sys.exit(2)
    if settings.api_workers > 1:
        sys.exit(workers.serve(settings, SERVER_OPTIONS))
    sockets = listen_sockets(settings)
    uvicorn.Server(uvicorn.Config(build(), **SERVER_OPTIONS)).run(sockets=sockets)


if __name__ == "__main__":
    main()
