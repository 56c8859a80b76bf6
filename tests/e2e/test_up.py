"""`kdbl-control up` as a user runs it: a real process, a real MCP client, real signals, a second run."""

from __future__ import annotations

import json
import os
import queue
import re
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
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
TOOLS_LIST = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class UpProcess:
    def __init__(self, *args: str) -> None:
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*CONTROL, "up", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def wait_for(self, needle: str, stall_s: float = 120, bound_s: float = 900) -> None:
        """Until a line holds `needle`: bounded by progress (`stall_s` without a new line, or the process
        gone, fails), and by `bound_s` in all, so a loaded machine that is merely slow still passes."""
        if needle in self.text:
            return
        now = time.monotonic()
        stalled_at, deadline = now + stall_s, now + bound_s
        while (now := time.monotonic()) < min(stalled_at, deadline):
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.output.append(line)
            stalled_at = now + stall_s
            if needle in line:
                return
        raise AssertionError(f"'{needle}' never appeared; output:\n{self.text}")

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.drain()
        return code

    def drain(self) -> None:
        while not self.lines.empty():
            self.output.append(self.lines.get())

    @property
    def text(self) -> str:
        return "".join(self.output)


def _postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().split()[0])


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _running(pid)


def _admin(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CONTROL, "--data-dir", str(data_dir), *args], capture_output=True, text=True,
                          timeout=120)


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
        first.wait_for("2 files listed, 2 indexed")
        token_file = data_dir / "demo-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token not in first.text  # the banner shows a placeholder; the config with it is a 0600 file
        shown = json.loads(first.text[first.text.index("{"):first.text.rindex("}") + 1])
        assert str(token_file) in shown["mcpServers"]["kdbl"]["headers"]["Authorization"]
        config_file = data_dir / "mcp-client.json"
        assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
        config = json.loads(config_file.read_text())["mcpServers"]["kdbl"]
        assert config["headers"]["Authorization"] == f"Bearer {token}"
        assert config["url"] == f"http://127.0.0.1:{port}/mcp"

        hit, doc = await _search(f"http://127.0.0.1:{port}/mcp", token, "capybara scheduler")
        assert hit["key"] == "runbook.md" and "<mark>capybara</mark>" in hit["snippet"]
        assert doc["status"] == "ok" and "systemctl restart capy" in doc["chunks"][0]["text"]
        async with httpx.AsyncClient() as http:  # the hit's signed link serves the original file
            original = await http.get(hit["url"])
        assert original.status_code == 200 and original.content == (folder / "runbook.md").read_bytes()

        # the smoke test runs as printed, from a shell whose PATH lacks .venv/bin, and passes no token in argv
        smoke_line = re.search(r"^Smoke test: (.+)$", first.text, re.M).group(1)
        assert "--api-token-file" in smoke_line and token not in smoke_line
        smoke = subprocess.run(["bash", "-c", smoke_line + " --query 'backups vault' --json"],
                               capture_output=True, text=True, timeout=60,
                               env={**os.environ, "PATH": "/usr/bin:/bin"})
        assert smoke.returncode == 0, smoke.stderr
        assert json.loads(smoke.stdout)["hits"][0]["key"] == "faq.txt"
        by_env = subprocess.run([*CONTROL, "--api-url", f"http://127.0.0.1:{port}", "--json", "mcp", "smoke"],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "KDBL_API_TOKEN_FILE": str(token_file)})
        assert by_env.returncode == 0, by_env.stderr

        audit = _admin(data_dir, "--json", "mcp", "audit", "--tool", "search_content")
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
        postmaster = _postmaster_pid(data_dir)
    finally:
        code = first.stop()
    assert code == 0, first.text
    assert "stopped" in first.text
    assert _wait_gone(postmaster), "Ctrl-C left the embedded PostgreSQL running"

    second = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        second.wait_for("2 files listed, 0 indexed, 2 unchanged")
        assert (data_dir / "demo-token").read_text().strip() == token  # the still-valid token is kept
        hit, _ = await _search(f"http://127.0.0.1:{port}/mcp", token, "capybara")
        assert hit["key"] == "runbook.md"
    finally:
        assert second.stop() == 0, second.text


async def test_up_serves_within_seconds_while_a_10_mb_file_is_indexed_behind_it(tmp_path, pg_dir):
    folder = tmp_path / "big"
    folder.mkdir()
    line = "The archive keeps ledgers, letters and minutes of the harbour board for every year. "
    with open(folder / "novel.txt", "w") as out:
        for n in range(10 * 1024 * 1024 // (len(line) + 12)):
            out.write(f"{line}Entry {n}.\n")
        out.write("The final page names the quokkalantern treaty.\n")
    assert (folder / "novel.txt").stat().st_size >= 10_000_000
    data_dir, port = pg_dir / "data", _free_port()
    up = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        up.wait_for("Ctrl-C to stop")
        async with httpx.AsyncClient() as http:
            listed = await http.post(f"http://127.0.0.1:{port}/mcp", json=TOOLS_LIST, headers={
                **MCP_HEADERS, "Authorization": f"Bearer {(data_dir / 'demo-token').read_text().strip()}"})
        serving_after = time.monotonic() - up.started
        assert listed.status_code == 200 and "search_content" in listed.text
        assert "files listed" not in up.text  # served while the crawl was still running behind the server

        token = (data_dir / "demo-token").read_text().strip()
        deadline = time.monotonic() + 600
        while True:
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            transport = streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)
            async with http, Client(transport) as c:
                hits = (await c.call_tool("search_content", {"query": "quokkalantern", "mode": "lexical"}
                                          )).structured_content["hits"]
                sources = (await c.call_tool("list_sources", {})).structured_content
            if hits:
                break
            assert time.monotonic() < deadline, up.text
            assert up.proc.poll() is None, up.text
            time.sleep(1)
        print(f"\nserving after {serving_after:.1f} s, 10 MB file searchable after "
              f"{time.monotonic() - up.started:.1f} s")
        assert hits[0]["key"] == "novel.txt" and "<mark>quokkalantern</mark>" in hits[0]["snippet"]
        assert sources["sources"][0]["name"] == "big"
    finally:
        assert up.stop() == 0, up.text


def test_sigterm_and_a_crash_never_orphan_the_embedded_postgres_and_a_foreign_host_is_told_what_to_set(
        folder, pg_dir):
    data_dir, port = pg_dir / "data", _free_port()
    crashed = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port), "--host", "0.0.0.0")
    try:
        crashed.wait_for("Ctrl-C to stop")
        token = (data_dir / "demo-token").read_text().strip()
        auth = {**MCP_HEADERS, "Authorization": f"Bearer {token}"}
        url = f"http://127.0.0.1:{port}/mcp"
        foreign = httpx.post(url, json=TOOLS_LIST, headers={**auth, "Host": f"evil.example:{port}"})
        assert foreign.status_code == 421
        message = foreign.json()["error"]["message"]
        assert "evil.example" in message and "--host" in message and "KDBL_ALLOWED_HOSTS" in message
        for name in (socket.gethostname(), "host.docker.internal"):  # what a container uses to reach the host
            allowed = httpx.post(url, json=TOOLS_LIST, headers={**auth, "Host": f"{name}:{port}"})
            assert allowed.status_code == 200, name
        assert _admin(data_dir, "tenant", "list").returncode == 0
        postmaster = _postmaster_pid(data_dir)
        crashed.stop(signal.SIGKILL)
    finally:
        if crashed.proc.poll() is None:
            crashed.proc.kill()
    assert _running(postmaster)  # what a crash leaves behind ...

    restarted = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        restarted.wait_for("Ctrl-C to stop")
        notice = f"stopped a PostgreSQL server (pid {postmaster}) that an earlier run left behind"
        assert notice in restarted.text
        assert not _running(postmaster)  # ... is found and replaced
        assert httpx.post(f"http://127.0.0.1:{port}/mcp", json=TOOLS_LIST, headers={
            **MCP_HEADERS, "Authorization": f"Bearer {token}", "Host": f"{socket.gethostname()}:{port}"},
        ).status_code == 421  # on 127.0.0.1 only loopback names pass
        listed = _admin(data_dir, "--json", "source", "list")
        assert listed.returncode == 0 and json.loads(listed.stdout)[0]["tenant"] == "demo"
        postmaster = _postmaster_pid(data_dir)
        code = restarted.stop(signal.SIGTERM)
    finally:
        if restarted.proc.poll() is None:
            restarted.proc.kill()
    assert code == 0, restarted.text
    assert "stopped." in restarted.text
    assert _wait_gone(postmaster), "SIGTERM left the embedded PostgreSQL running"


def test_up_with_a_missing_folder_is_a_one_line_error(tmp_path):
    result = subprocess.run([*CONTROL, "up", str(tmp_path / "nope"), "--data-dir", str(tmp_path / "d"),
                             "--port", str(_free_port())], capture_output=True, text=True, timeout=60,
                            env={**os.environ})
    assert result.returncode != 0
    assert result.stderr.strip() == f"kdbl-control: {tmp_path / 'nope'} is not a directory"
