"""Third-party SSE clients against the legacy HTTP+SSE transport (issue 18): the official MCP Python SDK
1.x (`mcp.client.sse.sse_client` + `ClientSession`, the era the seed's SSE-only client came from) and
mcp-proxy in its default SSE client mode each complete initialize -> tools/list -> search_content ->
get_file_window against the real API with KDBL_LEGACY_SSE_ENABLED. Both run from the bridges venv
(tools/bridges: mcp 1.x, installed at setup by .ci/install-bridges.sh); the token travels in the
environment, never in argv."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from helpers import running_api
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from test_bridges import MCP_PROXY, bridge_env, bridges, locate_and_read  # noqa: F401 - bridges is a fixture

from kdbl_core.settings import Settings

SDK_V1_CLIENT = """
import asyncio, json, os, sys
from importlib.metadata import version
from mcp import ClientSession
from mcp.client.sse import sse_client

async def main(url):
    headers = {"Authorization": "Bearer " + os.environ["SSE_TEST_TOKEN"]}
    async with sse_client(url, headers=headers) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        tools = await session.list_tools()
        found = await session.call_tool("search_content", {"query": "okapi migration"})
        hit = found.structuredContent["hits"][0]
        window = await session.call_tool("get_file_window", {"source_id": hit["source_id"], "key": hit["key"]})
        print(json.dumps({"sdk": version("mcp"), "protocol": init.protocolVersion, "server": init.serverInfo.name,
                          "tools": [t.name for t in tools.tools], "hit": hit,
                          "text": window.structuredContent["text"]}))

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def sse_url(mcp_server, owner_url) -> Iterator[str]:
    with running_api(owner_url, Settings(mcp_enabled=True, legacy_sse_enabled=True)) as url:
        yield f"{url}/sse"


def test_the_official_python_sdk_1x_sse_client_locates_and_reads(bridges, mcp_server, sse_url, tmp_path):
    proc = subprocess.run([str(bridges / "bin" / "python"), "-c", SDK_V1_CLIENT, sse_url], capture_output=True,
                          text=True, timeout=60, env=bridge_env(tmp_path, SSE_TEST_TOKEN=mcp_server.token))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    print(f"\nmcp {out['sdk']} sse_client: protocol {out['protocol']}")
    assert out["sdk"].startswith("1.") and out["server"] == "kdbl-context-lake"
    assert {"search_content", "get_file_window"} <= set(out["tools"])
    assert (out["hit"]["key"], out["hit"]["source_id"]) == ("handbook.md", str(mcp_server.corpus.source_id))
    assert "quarterly okapi migration report" in out["text"]


async def test_mcp_proxy_in_its_default_sse_mode_bridges_stdio_to_the_legacy_transport(bridges, mcp_server,
                                                                                        sse_url, tmp_path):
    args = [sse_url]  # no --transport: mcp-proxy's client default is SSE; the token comes from its environment
    params = StdioServerParameters(command=str(MCP_PROXY), args=args,
                                   env=bridge_env(tmp_path, API_ACCESS_TOKEN=mcp_server.token))
    async with Client(params, mode="legacy") as client:
        found, window = await locate_and_read(client, mcp_server)
    assert found["hits"][0]["uri"].startswith("kdbl://file/") and window["chunks"]
