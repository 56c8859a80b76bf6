"""The MCP smoke test's client side (`kdbl-control mcp smoke`): initialize → tools/list → tools/call
against a running K-Lake API, through the official MCP Python client.

It lives here because the MCP SDK (`mcp`) belongs to the API: the import-linter contract "the MCP SDK
only in kdbl_api" (pyproject.toml) keeps every other package off it, and kdbl-control reaches this
module through its composition root (`kdbl_control.compose.mcp_smoke`).
"""

from __future__ import annotations

import json
from typing import Any

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


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
