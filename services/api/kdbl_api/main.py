"""`kdbl-api`: serve MCP over Streamable HTTP as the non-owner kdbl_api database role."""

from __future__ import annotations

import sys

import uvicorn

from kdbl_api.app import create_app
from kdbl_core import logging_setup
from kdbl_core.db.engine import async_engine
from kdbl_core.errors import ConfigError
from kdbl_core.settings import Settings


def main() -> None:
    settings = Settings()
    logging_setup.configure(settings.log_level, settings.log_format)
    try:
        engine = async_engine(settings.require_database_url(), pool_size=settings.db_pool_size)
    except ConfigError as exc:
        print(f"kdbl-api: {exc.message}", file=sys.stderr)
        sys.exit(2)
    app = create_app(settings, engine)
    uvicorn.run(app, host=settings.api_host, port=settings.api_port, log_config=None,
                proxy_headers=True, server_header=False)


if __name__ == "__main__":
    main()
