"""`kdbl-control up --legacy-sse` as a user runs it (issue 18): the banner names /sse, the official SDK's
SSE client searches through it, and Ctrl-C stops `up` promptly while an SSE session is still open (an
endless stream must not hold the graceful shutdown)."""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import httpx
import pytest
from mcp.client import Client
from mcp.client.sse import sse_client
from test_up import UpProcess, _free_port


@pytest.fixture
def folder(tmp_path) -> Path:
    root = tmp_path / "docs"
    root.mkdir()
    (root / "runbook.md").write_text("# Runbook\n\nRestart the capybara scheduler with `systemctl restart capy`.")
    return root


async def test_up_with_legacy_sse_serves_an_sse_client_and_stops_on_ctrl_c_with_a_session_open(folder, pg_dir):
    data_dir, port = pg_dir / "data", _free_port()
    up = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port), "--legacy-sse")
    try:
        up.wait_for("Ctrl-C to stop")
        up.wait_for("1 files listed, 1 indexed")
        assert re.search(rf"Legacy HTTP\+SSE .*http://127\.0\.0\.1:{port}/sse", up.text), up.text
        token = (data_dir / "demo-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        async with Client(sse_client(f"http://127.0.0.1:{port}/sse", headers=auth), mode="legacy") as client:
            result = await client.call_tool("search_content", {"query": "capybara scheduler"})
        assert result.structured_content["hits"][0]["key"] == "runbook.md"
        async with httpx.AsyncClient() as http, http.stream("GET", f"http://127.0.0.1:{port}/sse",
                                                             headers=auth) as stream:
            assert stream.status_code == 200
            started = time.monotonic()
            code = up.stop(signal.SIGINT)
            took = time.monotonic() - started
    finally:
        if up.proc.poll() is None:
            up.stop(signal.SIGKILL)
    assert code == 0 and "kdbl: stopped." in up.text, up.text
    # an open SSE stream never ends by itself: had `up` waited for it, `stop` would have timed out (60 s)
    print(f"up stopped {took:.1f} s after SIGINT with an SSE session open")
