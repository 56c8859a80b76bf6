"""Third-party MCP bridges against the real API: each completes initialize -> tools/list -> search_content ->
get_file_window, with the token passed by environment or a file, never on the command line.

* `mcp-proxy` (PyPI, sparfenyuk; stdio <-> Streamable HTTP): the token from `API_ACCESS_TOKEN`.
* `mcp-remote` (npm): `--header "Authorization:${KDBL_AUTH_HEADER}"`; mcp-remote expands `${VAR}` in header
  values from its environment, so the argv holds only the variable's name.
* `mcpo` (PyPI; MCP -> OpenAPI, what Open WebUI's "OpenAPI" tool servers call): a config file (mode 0600)
  holds the header; a search is an HTTP POST to `/<server>/search_content`.

The stdio bridges are driven by the official MCP Python SDK's stdio client (`Client(StdioServerParameters)`),
as a desktop client would spawn them. The bridges live outside the project's venv (mcp-proxy needs mcp<2):
.ci/install-bridges.sh installs them at setup (`./dev setup` / `./dev test`), mcp-remote comes with the
JavaScript tools (.ci/install-node.sh). A missing install FAILS here: these tests never install anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

REPO_ROOT = Path(__file__).resolve().parents[2]
BRIDGES = REPO_ROOT / "tools" / "bridges"
REQUIREMENTS = Path(__file__).resolve().parent / "bridges" / "requirements.txt"
MCP_PROXY = BRIDGES / "bin" / "mcp-proxy"
MCPO = BRIDGES / "bin" / "mcpo"
QUERY = "okapi migration"


@pytest.fixture(scope="session")
def bridges() -> Path:
    stamp = BRIDGES / ".kdbl-install-stamp"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    current = stamp.is_file() and stamp.read_text().split()[0] == digest
    if not (MCP_PROXY.is_file() and MCPO.is_file() and current):
        pytest.fail(f"the MCP bridges are not installed for {REQUIREMENTS.name}: run ./dev setup "
                    "(or bash .ci/install-bridges.sh)", pytrace=False)
    return BRIDGES


def bridge_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment: PATH and a temporary HOME (mcp-remote keeps state under ~/.mcp-auth)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "NO_COLOR": "1", **extra}


async def locate_and_read(client: Client, mcp_server) -> tuple[dict, dict]:
    """tools/list -> search_content -> get_file_window through a connected (initialized) client."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert {"search_content", "get_file_window"} <= set(tools)
    found = await client.call_tool("search_content", {"query": QUERY})
    assert not found.is_error, found
    [hit] = found.structured_content["hits"]
    assert (hit["key"], hit["source_id"]) == ("handbook.md", str(mcp_server.corpus.source_id))
    window = await client.call_tool("get_file_window", {"source_id": hit["source_id"], "key": hit["key"]})
    assert not window.is_error, window
    read = window.structured_content["text"]
    assert "quarterly okapi migration report" in read
    return found.structured_content, window.structured_content


async def test_mcp_proxy_bridges_stdio_to_the_api_with_the_token_from_its_environment(bridges, mcp_server,
                                                                                       tmp_path):
    args = ["--transport", "streamablehttp", mcp_server.api_mcp_url]
    params = StdioServerParameters(command=str(MCP_PROXY), args=args,
                                   env=bridge_env(tmp_path, API_ACCESS_TOKEN=mcp_server.token))
    async with Client(params) as client:
        found, _ = await locate_and_read(client, mcp_server)
    assert found["hits"][0]["uri"].startswith("kdbl://file/")
    assert mcp_server.token not in " ".join(args)


async def test_mcp_remote_bridges_stdio_to_the_api_with_the_token_from_its_environment(mcp_js, mcp_server,
                                                                                       tmp_path):
    args = [str(mcp_js.mcp_remote), mcp_server.api_mcp_url, "--transport", "http-only",
            "--header", "Authorization:${KDBL_AUTH_HEADER}"]
    params = StdioServerParameters(command=str(mcp_js.node), args=args,
                                   env=bridge_env(tmp_path, KDBL_AUTH_HEADER=f"Bearer {mcp_server.token}"))
    async with Client(params) as client:
        await locate_and_read(client, mcp_server)
    assert mcp_server.token not in " ".join(args)


class Mcpo:
    """`mcpo --config FILE` on a loopback port; started when its log says uvicorn is listening."""

    def __init__(self, config: Path, port: int, cwd: Path, env: dict[str, str]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.args = [str(MCPO), "--host", "127.0.0.1", "--port", str(port), "--config", str(config)]
        self.proc = subprocess.Popen(self.args, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.log: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, name="mcpo-log", daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            if "Uvicorn running on" in line:
                self.ready.set()
        self.ready.set()  # exited: wake the waiter, which then sees the dead process

    def wait_ready(self, timeout: float = 60) -> None:
        started = self.ready.wait(timeout) and self.proc.poll() is None
        assert started, "mcpo did not start:\n" + "".join(self.log)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=15)


@pytest.fixture
def mcpo(bridges, mcp_server, tmp_path) -> Iterator[Mcpo]:
    from helpers import free_port

    config = tmp_path / "mcpo.json"
    config.touch(mode=0o600)
    config.write_text(json.dumps({"mcpServers": {"kdbl": {
        "type": "streamable-http", "url": mcp_server.api_mcp_url,
        "headers": {"Authorization": f"Bearer {mcp_server.token}"}}}}))
    server = Mcpo(config, free_port(), tmp_path, bridge_env(tmp_path))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_mcpo_serves_search_content_as_an_openapi_route_that_returns_hits(mcpo, mcp_server):
    with httpx.Client(base_url=mcpo.url, timeout=60, trust_env=False) as http:
        spec = http.get("/kdbl/openapi.json").raise_for_status().json()
        assert {"/search_content", "/get_file_window"} <= set(spec["paths"]), sorted(spec["paths"])
        found = http.post("/kdbl/search_content", json={"query": QUERY})
        assert found.status_code == 200, found.text
        body = found.json()
        [hit] = body["hits"]
        assert (hit["key"], hit["source_id"]) == ("handbook.md", str(mcp_server.corpus.source_id))
        assert "<mark>okapi</mark>" in hit["snippet"]
        window = http.post("/kdbl/get_file_window", json={"source_id": hit["source_id"], "key": hit["key"]})
        assert window.status_code == 200, window.text
        assert "quarterly okapi migration report" in json.dumps(window.json())
    assert mcp_server.token not in " ".join(mcpo.args)


def test_mcpo_passes_the_apis_invalid_argument_refusal_through_as_http_422(mcpo):
    """K-Lake's -32602 (error.data.field names the argument) reaches the OpenAPI caller as 422 with it."""
    with httpx.Client(base_url=mcpo.url, timeout=60, trust_env=False) as http:
        refused = http.post("/kdbl/search_content", json={"query": QUERY, "limit": 0})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert detail["data"] == {"field": "limit"} and detail["message"].startswith("invalid argument 'limit'")
