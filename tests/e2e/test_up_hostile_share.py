"""`kdbl-control up` on a folder that holds its own data folder and links out of itself (issue 27 §2).

Before: the download-signing secret and the internal fetch token lay in DIR/secrets.json, pg-password beside
them, and a link in the crawled folder (or the data folder inside it, `up .` with the default DIR=.kdbl)
indexed them for search. Now: no secrets.json; the data folder, the links out of the folder and those into
the data folder are skipped with their reasons; search finds none of their text.
"""

from __future__ import annotations

from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from test_up import UpProcess, _free_port  # the e2e folder is on sys.path (rootdir conftest, no __init__)


async def _hits(url: str, token: str, query: str) -> list[dict]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool("search_content", {"query": query, "mode": "lexical"})
    return result.structured_content["hits"]


async def test_up_never_indexes_its_data_folder_or_what_links_lead_out_to(tmp_path):
    folder = tmp_path / "share"
    folder.mkdir()
    (folder / "notes.md").write_text("# Notes\n\nThe wombat migration starts on Monday.")
    data_dir = folder / ".kdbl"  # `kdbl-control up .` with the default data folder
    (folder / "link-passwd.txt").symlink_to("/etc/passwd")
    (folder / "link-pgpass.txt").symlink_to(data_dir / "pg-password")
    (folder / "link-token.txt").symlink_to(".kdbl/demo-token")
    port = _free_port()
    up = UpProcess(str(folder), "--data-dir", str(data_dir), "--port", str(port))
    try:
        up.wait_for("Ctrl-C to stop")
        up.wait_for("1 files listed")
        up.wait_for("problem: link-token.txt")
        assert not (data_dir / "secrets.json").exists()
        token = (data_dir / "demo-token").read_text().strip()
        password = (data_dir / "pg-password").read_text().strip()
        url = f"http://127.0.0.1:{port}/mcp"
        assert [h["key"] for h in await _hits(url, token, "wombat migration")] == ["notes.md"]
        for query in (password, token, "root nologin bash daemon", "download_signing_secret"):
            assert await _hits(url, token, query) == [], query
    finally:
        code = up.stop()
    assert code == 0, up.text
    problems = {line.split(": ", 2)[1]: line.split(": ", 2)[2] for line in up.text.splitlines()
                if line.strip().startswith("problem: ")}
    assert problems[".kdbl"] == "the worker's private data is never read; skipped"
    assert problems["link-passwd.txt"] == problems["link-pgpass.txt"] == problems["link-token.txt"] == (
        "symbolic link not followed (the source's follow_symlinks is off); skipped")
