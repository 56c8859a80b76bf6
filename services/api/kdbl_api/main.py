"""`kdbl-api`: serve MCP over Streamable HTTP as the non-owner kdbl_api database role."""

from __future__ import annotations

import sys

import uvicorn
from starlette.applications import Starlette

from kdbl_api import workers
from kdbl_api.app import create_app
from kdbl_core import logging_setup
from kdbl_core.db.engine import async_engine
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings


def build() -> Starlette:
    """The app from the environment (also the uvicorn factory each worker process calls)."""
    settings = Settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    # start-up checks, /readyz, /capacity and OIDC tenant lookups (cached) only: the request path has its
    # own pool of KDBL_DB_POOL_SIZE connections (kdbl_core.db.pgpool)
    engine = async_engine(settings.require_database_url(), pool_size=2)
    return create_app(settings, engine)


def main() -> None:
    settings = Settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    try:
        settings.require_database_url()
    except ConfigError as exc:
        print(f"kdbl-api: {exc.message}", file=sys.stderr)
        sys.exit(2)
    options = {"log_config": None, "proxy_headers": True, "server_header": False}
    if settings.api_workers > 1:
        sys.exit(workers.serve(settings.api_host, settings.api_port, settings.api_workers, options))
    uvicorn.run(build(), host=settings.api_host, port=settings.api_port, **options)


if __name__ == "__main__":
    main()
