"""`kdbl-control up` as a user runs it: a real process, a real MCP client, Ctrl-C, and a second run."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

CONTROL = [sys.executable, "-m", "kdbl_control.cli"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UpProcess:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*CONTROL, "up", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, needle: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.output.append(line)
            if needle in line:
                return
        raise AssertionError(f"'{needle}' never appeared; output:\n{''.join(self.output)}")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        code = self.proc.wait(timeout=60)
        while not self.lines.empty():
            self.output.append(self.lines.get())
        return code

    @property
    def text(self) -> str:
        return "".join(self.output)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("up-docs")
    (root / "runbook.md").write_text("# Runbook\n\nRestart the capybara scheduler with `systemctl restart capy`.")
    (root / "faq.txt").write_text("Frequently asked: where are the backups? In the vault.")
    return root


async def _search(url: str, token: str, query: str):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool("search_content", {"query": query})
        hit = result.structured_content["hits"][0]
        text = await client.call_tool("get_file_text", {"source_id": hit["source_id"], "key": hit["key"]})
    return hit, text.structured_content


async def test_up_serves_mcp_restarts_without_reindexing_and_stops_on_ctrl_c(folder, tmp_path, pg_dir):
    data_dir, port = pg_dir / "data", _free_port()
    first = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        first.wait_for("Ctrl-C to stop")
        assert "2 files listed, 2 indexed" in first.text
        token_file = data_dir / "demo-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert json.loads(first.text[first.text.index("{"):first.text.rindex("}") + 1])["mcpServers"]["kdbl"]

        hit, doc = await _search(f"http://127.0.0.1:{port}/mcp", token, "capybara scheduler")
        assert hit["key"] == "runbook.md" and "<mark>capybara</mark>" in hit["snippet"]
        assert doc["status"] == "ok" and "systemctl restart capy" in doc["chunks"][0]["text"]
        async with httpx.AsyncClient() as http:  # the hit's signed link serves the original file
            original = await http.get(hit["url"])
        assert original.status_code == 200 and original.content == (folder / "runbook.md").read_bytes()

        smoke = subprocess.run([*CONTROL, "--api-url", f"http://127.0.0.1:{port}", "--api-token", token, "--json",
                                "mcp", "smoke", "--query", "backups vault"], capture_output=True, text=True,
                               timeout=60)
        assert smoke.returncode == 0, smoke.stderr
        assert json.loads(smoke.stdout)["hits"][0]["key"] == "faq.txt"

        audit = subprocess.run([*CONTROL, "--json", "mcp", "audit", "--tool", "search_content", "--data-dir",
                                str(data_dir)], capture_output=True, text=True, timeout=60)
        assert audit.returncode == 0, audit.stderr
        assert {row["tool"] for row in json.loads(audit.stdout)} == {"search_content"}
        assert len(json.loads(audit.stdout)) >= 2

        locked = subprocess.run([*CONTROL, "up", str(folder), "--data-dir", str(data_dir), "--port",
                                 str(_free_port())], capture_output=True, text=True, timeout=60)
        assert locked.returncode != 0
        assert locked.stderr.strip().splitlines()[-1].startswith("kdbl-control: data dir")
        assert "in use" in locked.stderr

        busy = subprocess.run([*CONTROL, "up", str(folder), "--data-dir", str(pg_dir / "other"), "--port",
                               str(port)], capture_output=True, text=True, timeout=60)
        assert busy.returncode != 0 and "already in use" in busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1
    finally:
        code = first.stop()
    assert code == 0, first.text
    assert "stopped" in first.text

    second = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        second.wait_for("Ctrl-C to stop")
        assert "2 files listed, 0 indexed, 2 unchanged" in second.text
        assert (data_dir / "demo-token").read_text().strip() == token  # the still-valid token is kept
        hit, _ = await _search(f"http://127.0.0.1:{port}/mcp", token, "backups")
        assert hit["key"] == "faq.txt"
    finally:
        assert second.stop() == 0, second.text


def test_up_with_a_missing_folder_is_a_one_line_error(tmp_path):
    result = subprocess.run([*CONTROL, "up", str(tmp_path / "nope"), "--data-dir", str(tmp_path / "d"),
                             "--port", str(_free_port())], capture_output=True, text=True, timeout=60,
                            env={**os.environ})
    assert result.returncode != 0
    assert result.stderr.strip() == f"kdbl-control: {tmp_path / 'nope'} is not a directory"
