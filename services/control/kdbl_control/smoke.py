"""`mcp smoke`: initialize → tools/list → tools/call through the official MCP Python client (the API's
kdbl_api.mcp_smoke, through kdbl_control.compose), and the PAT file `mcp smoke` and `mcp stdio` read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kdbl_control import compose
from kdbl_core.errors import ConfigError


async def run_smoke(api_url: str, token: str, query: str = "search") -> dict[str, Any]:
    """The report of one initialize → tools/list → tools/call round (url, server, tools, hits): the API's
    own MCP client (kdbl_api.mcp_smoke) through the composition root, so kdbl-control imports no `mcp`."""
    return await compose.mcp_smoke(api_url, token, query)


def read_token(path: str | Path | None) -> str | None:
    """The PAT in `path` (--api-token-file / KDBL_API_TOKEN_FILE): the first line, whitespace stripped."""
    if not path:
        return None
    try:
        token = Path(path).expanduser().read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the API token file {path}: {exc.strerror}") from None
    if not token:
        raise ConfigError(f"the API token file {path} is empty")
    return token.splitlines()[0].strip()
