"""The official MCP Inspector CLI against the real API: list and call the tools; refused without a token;
and its SSE transport against the legacy HTTP+SSE endpoints (issue 18).

The Inspector talks to the API directly (it can send the Authorization header itself), in the default
"legacy" protocol era an ad-hoc URL run uses. `--format json` prints one JSON object on stdout
(`{"result": ...}`); errors go to stderr as `{"error": {"code": ...}}` with a non-zero exit code.
"""

from __future__ import annotations

import json
import os
import subprocess

import jsonschema
import pytest
from helpers import running_api

from kdbl_core.settings import Settings

EXIT_AUTH_REQUIRED = 3  # the Inspector CLI's exit-code map: auth_required


def _runner(mcp_js, url: str, transport: str, default_token: str, tmp_path):
    env = dict(os.environ, HOME=str(tmp_path), NO_COLOR="1")
    env.pop("MCP_CATALOG_PATH", None)

    def run(*args: str, token: str | None = default_token) -> subprocess.CompletedProcess[str]:
        cmd = [str(mcp_js.node), str(mcp_js.inspector), "--cli", url, "--transport", transport, "--format", "json",
               *args]
        if token is not None:
            cmd += ["--header", f"Authorization: Bearer {token}"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)

    return run


@pytest.fixture
def inspector(mcp_js, mcp_server, tmp_path):
    """Run `inspector --cli <api>/mcp --transport http ...`; HOME is a temp dir (it keeps state there)."""
    return _runner(mcp_js, mcp_server.api_mcp_url, "http", mcp_server.token, tmp_path)


@pytest.fixture(scope="module")
def legacy_sse_url(mcp_server, owner_url):
    """A second API on the same database with the legacy HTTP+SSE transport on (issue 18)."""
    with running_api(owner_url, Settings(mcp_enabled=True, legacy_sse_enabled=True)) as url:
        yield f"{url}/sse"


@pytest.fixture
def inspector_sse(mcp_js, mcp_server, legacy_sse_url, tmp_path):
    """Run `inspector --cli <api>/sse --transport sse ...` (the Inspector's SSE client transport)."""
    return _runner(mcp_js, legacy_sse_url, "sse", mcp_server.token, tmp_path)


def result_of(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, (
        f"inspector rc={proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}")
    return json.loads(proc.stdout)["result"]


def list_tools(inspector) -> dict[str, dict]:
    return {tool["name"]: tool for tool in result_of(inspector("--method", "tools/list"))["tools"]}


def test_inspector_lists_search_content_and_get_file_text(inspector):
    tools = list_tools(inspector)
    assert {"search_content", "get_file_text"} <= set(tools)
    for name in ("search_content", "get_file_text"):
        tool = tools[name]
        assert tool["inputSchema"]["type"] == "object" and tool["outputSchema"]["type"] == "object"
        assert tool["annotations"]["readOnlyHint"] is True
    assert tools["search_content"]["inputSchema"]["required"] == ["query"]


def test_inspector_search_content_returns_hits_as_structured_content(inspector, mcp_server):
    schema = list_tools(inspector)["search_content"]["outputSchema"]
    result = result_of(inspector("--method", "tools/call", "--tool-name", "search_content",
                                 "--tool-arg", "query=okapi migration"))
    assert result["isError"] is False
    structured = result["structuredContent"]
    jsonschema.validate(structured, schema)
    [hit] = structured["hits"]
    source_id = str(mcp_server.corpus.source_id)
    assert hit["key"] == "handbook.md" and hit["source_id"] == source_id
    assert hit["uri"] == f"kdbl://file/{source_id}/handbook.md"
    assert "<mark>okapi</mark>" in hit["snippet"] and "okapi migration" in hit["text"]
    text_blocks = [c for c in result["content"] if c["type"] == "text"]
    assert json.loads(text_blocks[0]["text"]) == structured  # the text mirror of structuredContent
    assert [c["uri"] for c in result["content"] if c["type"] == "resource_link"] == [hit["uri"]]


def test_inspector_get_file_text_returns_the_files_chunks(inspector, mcp_server):
    schema = list_tools(inspector)["get_file_text"]["outputSchema"]
    source_id = str(mcp_server.corpus.source_id)
    result = result_of(inspector("--method", "tools/call", "--tool-name", "get_file_text",
                                 "--tool-arg", f"source_id={source_id}", "key=policy/travel.md"))
    assert result["isError"] is False
    structured = result["structuredContent"]
    jsonschema.validate(structured, schema)
    assert structured["status"] == "ok" and structured["total_chunks"] >= 1
    assert "economy class" in "".join(chunk["text"] for chunk in structured["chunks"])


def test_inspector_reads_a_window_around_a_search_hit(inspector, mcp_server):
    """Issue 18's loop over Streamable HTTP: search_content, then get_file_window at the hit's seq."""
    schema = list_tools(inspector)["get_file_window"]["outputSchema"]
    found = result_of(inspector("--method", "tools/call", "--tool-name", "search_content",
                                "--tool-arg", "query=okapi migration"))
    [hit] = found["structuredContent"]["hits"]
    window = result_of(inspector("--method", "tools/call", "--tool-name", "get_file_window",
                                 "--tool-arg", f"source_id={hit['source_id']}", f"key={hit['key']}",
                                 f"start={hit['seq']}"))
    assert window["isError"] is False
    jsonschema.validate(window["structuredContent"], schema)
    assert window["structuredContent"]["window"]["start"] == hit["seq"]
    assert "okapi migration" in window["structuredContent"]["text"]


def test_inspector_without_a_token_stops_at_auth_required(inspector):
    """No token: the API's 401 + resource_metadata challenge makes the Inspector want OAuth, which a
    non-interactive run refuses — the CLI exits auth_required instead of listing anything."""
    proc = inspector("--method", "tools/list", token=None)
    assert proc.returncode == EXIT_AUTH_REQUIRED, f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert json.loads(proc.stderr.strip().splitlines()[-1])["error"]["code"] == "auth_required"
    assert proc.stdout.strip() == ""


def test_the_inspectors_sse_transport_lists_searches_and_reads_a_window(inspector_sse, mcp_server):
    """Issue 18: the Inspector over the legacy HTTP+SSE transport: tools/list -> search_content ->
    get_file_window, the same answers as over /mcp."""
    tools = {tool["name"]: tool for tool in result_of(inspector_sse("--method", "tools/list"))["tools"]}
    assert {"search_content", "get_file_window"} <= set(tools)
    found = result_of(inspector_sse("--method", "tools/call", "--tool-name", "search_content",
                                    "--tool-arg", "query=okapi migration"))
    jsonschema.validate(found["structuredContent"], tools["search_content"]["outputSchema"])
    [hit] = found["structuredContent"]["hits"]
    assert hit["key"] == "handbook.md" and hit["source_id"] == str(mcp_server.corpus.source_id)
    window = result_of(inspector_sse("--method", "tools/call", "--tool-name", "get_file_window",
                                     "--tool-arg", f"source_id={hit['source_id']}", f"key={hit['key']}",
                                     f"start={hit['seq']}"))
    assert window["isError"] is False
    assert "okapi migration" in window["structuredContent"]["text"]


def test_the_inspectors_sse_transport_without_a_token_stops_at_auth_required(inspector_sse):
    """/sse answers 401 with the same resource_metadata challenge as /mcp: the Inspector wants OAuth."""
    proc = inspector_sse("--method", "tools/list", token=None)
    assert proc.returncode == EXIT_AUTH_REQUIRED, f"stdout: {proc.stdout}\nstderr: {proc.stderr}"
    assert json.loads(proc.stderr.strip().splitlines()[-1])["error"]["code"] == "auth_required"
    assert proc.stdout.strip() == ""
