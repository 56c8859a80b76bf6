"""`kdbl-control mcp stdio` (issue 18): the official SDK's stdio client spawns the real command, which
forwards to the real API's POST /mcp: initialize -> tools/list -> search_content -> get_file_window;
errors keep their codes; a bad token is a clear error; the token never reaches argv or the logs, and
stderr carries JSON log lines only."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from helpers import db_of, direct_search_timings, make_corpus, running_api, search_and_read_a_window
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError

from kdbl_control import admin

KDBL_CONTROL = str(Path(sys.executable).parent / "kdbl-control")  # the console script a desktop client runs
FILES = {
    "handbook.md": "# Handbook\n\nThe quarterly okapi migration report is due in March.\n",
    "policy/travel.md": "Travel policy: economy class for flights under six hours.",
}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"stdio-{uuid.uuid4().hex[:10]}"
    folder = tmp_path_factory.mktemp("stdio")
    corpus = make_corpus(owner_engine, worker_engine, folder / "kb", FILES, tenant=name)
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="desktop")[0]
    token_file = folder / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    with running_api(owner_url) as url:
        yield {"url": url, "token": token, "token_file": token_file, "corpus": corpus, "dir": folder}


@asynccontextmanager
async def bridged(world, *, token_file: Path | None = None, env: dict[str, str] | None = None, errlog=None):
    args = ["mcp", "stdio", "--api-url", world["url"]]
    if token_file is not None:
        args += ["--token-file", str(token_file)]
    server = StdioServerParameters(command=KDBL_CONTROL, args=args, env=env or {})
    async with Client(server, mode="legacy") if errlog is None else _with_errlog(server, errlog) as client:
        yield client


def _with_errlog(server: StdioServerParameters, errlog):
    from mcp.client.stdio import stdio_client

    return Client(stdio_client(server, errlog=errlog), mode="legacy")


async def test_a_spawned_bridge_initializes_lists_searches_and_reads_a_window(world):
    source_id = str(world["corpus"].source_id)
    with (world["dir"] / "stderr.log").open("w+") as errlog:
        async with bridged(world, token_file=world["token_file"], errlog=errlog) as client:
            assert client.server_info.name == "kdbl-context-lake"
            timings, _ = await search_and_read_a_window(client, source_id)
            resources = await client.list_resources()  # not only tools: every method is relayed
            assert f"kdbl://file/{source_id}/handbook.md" in {str(r.uri) for r in resources.resources}
        errlog.seek(0)
        logged = [json.loads(line) for line in errlog.read().splitlines()]  # JSON lines only, or this fails
    direct = await direct_search_timings(world["url"], world["token"])
    print(f"\nsearch_content p50 over {len(timings)} calls: stdio bridge {statistics.median(timings):.1f} ms, "
          f"POST /mcp directly {statistics.median(direct):.1f} ms")
    assert statistics.median(timings) < 250, timings
    assert [r["msg"] for r in logged] == ["mcp stdio bridge started", "mcp stdio bridge stopped"]
    assert world["token"] not in json.dumps(logged)


async def test_the_token_can_come_from_kdbl_api_token_and_errors_keep_their_codes(world):
    async with bridged(world, env={"KDBL_API_TOKEN": world["token"]}) as client:
        with pytest.raises(MCPError) as invalid:
            await client.call_tool("search_content", {"query": "okapi", "mode": "vector"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
    assert invalid.value.code == -32602 and "'mode'" in invalid.value.message
    assert unknown.value.code == -32602 and "unknown tool" in unknown.value.message


async def test_a_bad_token_is_a_clear_error_at_initialize_and_stays_out_of_the_logs(world):
    wrong = f"kdblpat_{'0' * 16}_{'A' * 43}"
    bad_file = world["dir"] / "bad-token"
    bad_file.write_text(wrong)
    with (world["dir"] / "bad-stderr.log").open("w+") as errlog:
        with pytest.raises(BaseException) as raised:  # the SDK wraps it in its task groups' ExceptionGroups
            async with bridged(world, token_file=bad_file, errlog=errlog):
                pass
        errlog.seek(0)
        logged = [json.loads(line) for line in errlog.read().splitlines()]
    refused = mcp_error_in(raised.value)
    assert refused.code == -32001
    assert "refused the token" in refused.message and "--token-file" in refused.message
    assert "api refused the token" in [r["msg"] for r in logged]
    assert wrong not in json.dumps(logged)


def mcp_error_in(exc: BaseException) -> MCPError:
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        try:
            return mcp_error_in(inner)
        except AssertionError:
            continue
    raise AssertionError(f"no MCPError in {exc!r}")


@pytest.mark.parametrize("args, env, says", [
    (["--api-token", "kdblpat_x"], {"KDBL_API_TOKEN": ""}, "does not take the token on the command line"),
    ([], {"KDBL_API_TOKEN": "", "KDBL_API_TOKEN_FILE": ""}, "needs a token: --token-file FILE"),
])
def test_a_token_on_the_command_line_or_none_at_all_ends_it_with_one_json_log_line(args, env, says):
    proc = subprocess.run([KDBL_CONTROL, "mcp", "stdio", "--api-url", "http://127.0.0.1:9", *args],
                          capture_output=True, text=True, timeout=60, input="",
                          env={**os.environ, **env})
    [line] = proc.stderr.splitlines()
    logged = json.loads(line)
    assert proc.returncode == 2 and proc.stdout == ""
    assert logged["msg"] == "mcp stdio cannot start" and says in logged["reason"]
    assert "kdblpat_x" not in proc.stderr
