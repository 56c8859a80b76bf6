"""`mcp smoke`: initialize → tools/list → tools/call through the official MCP Python client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kdbl_core.errors import ConfigError


async def run_smoke(api_url: str, token: str, query: str = "search") -> dict[str, Any]:
    url = api_url.rstrip("/")
    if not url.endswith("/mcp"):
        url += "/mcp"
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    report: dict[str, Any] = {"url": url}
    async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
        info = client.server_info if hasattr(client, "server_info") else None
        report["server"] = getattr(info, "name", None)
        tools = await client.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        result = await client.call_tool("search_content", {"query": query, "limit": 3, "mode": "lexical"})
        if result.is_error:
            raise RuntimeError(f"tools/call failed: {result.content}")
        structured = result.structured_content or json.loads(result.content[0].text)
        report["hits"] = [{"key": h["key"], "seq": h["seq"], "rank": h["rank"]} for h in structured["hits"]]
    return report


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
