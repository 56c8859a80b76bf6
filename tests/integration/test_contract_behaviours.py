"""The skills reference's own behaviours, each held by a test (issue 12 item 6).

search_content: the source_id restriction, limit 20 by default, modified_after/before, neighbour chunks
in a hit's text within ~1,800 characters and `truncated`; get_file_text: 5,000 chunks at most and 1 MB
of text, each with `truncated`, the text sent once per kind of client; get_file_window: 40 chunks by
default, within 16,000 characters (issue 28); list_sources/list_files: 50 by default, 200 at most; download links live ~15 minutes; the
audit row names the sources read and carries the call's time. Served lexically (no embedder).
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from datetime import datetime, timezone

import httpx
import jwt
import pytest
from helpers import db_of, make_corpus, running_api, window_chunk_texts
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.pipeline import Indexer, load_sources

OLD, NEW = datetime(2020, 1, 1, tzinfo=timezone.utc), datetime(2024, 6, 1, tzinfo=timezone.utc)
PARA = "Filler sentence about ordinary matters and nothing in particular. " * 3  # ~200 chars


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("contract")
    files = {f"zebra-{i:02d}.md": f"Note {i}: the zebra crossing count was {i}." for i in range(60)}
    files |= {"cap.md": "to be given 5,003 chunks", "big.md": "to be given 3 MB of text"}
    # paragraphs of ~1,000 characters: the chunker puts one or two in a chunk
    files["long.txt"] = "\n\n".join(f"Part {i} " + ("lorem ipsum dolor sit amet " * 37) + ("okapi" if i == 20 else "")
                                    for i in range(120))
    main = make_corpus(owner_engine, worker_engine, root / "main-src", files, tenant="contract")
    dated = root / "dated-src"
    dated.mkdir()
    for name, when in (("old.md", OLD), ("new.md", NEW)):
        (dated / name).write_text(f"The quokka census of {when.year}.")
        os.utime(dated / name, (when.timestamp(), when.timestamp()))
    other = make_corpus(owner_engine, worker_engine, dated, {}, tenant="contract")
    for i in range(52):
        admin.add_source(db_of(owner_engine), "contract", protocol="fs", config={"root": str(dated)},
                         name=f"empty-{i:02d}")
    token, _ = admin.create_token(db_of(owner_engine), tenant_name="contract", name="reader")
    settings = Settings(mcp_enabled=True, rate_limit_per_minute=0, api_public_url="http://kdbl.example",
                        download_signing_secret="s" * 40, internal_fetch_token="f" * 40)
    with running_api(owner_url, settings) as url:
        yield {"url": url, "main": main, "other": other, "token": token}


@asynccontextmanager
async def mcp(world):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {world['token']}"})
    async with http, Client(streamable_http_client(f"{world['url']}/mcp", http_client=http)) as client:
        yield client


async def call(world, tool, args):
    async with mcp(world) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


async def test_search_limit_defaults_to_20_and_goes_to_100(world):
    hits = (await call(world, "search_content", {"query": "zebra", "mode": "lexical"}))["hits"]
    assert len(hits) == 20
    assert len((await call(world, "search_content", {"query": "zebra", "limit": 100}))["hits"]) == 60


async def test_search_restricted_to_a_source_returns_only_that_source(world):
    sid = str(world["other"].source_id)
    anywhere = await call(world, "search_content", {"query": "quokka census zebra", "limit": 100})
    only = await call(world, "search_content", {"query": "quokka census zebra", "limit": 100, "source_id": sid})
    assert {h["source_id"] for h in anywhere["hits"]} == {sid, str(world["main"].source_id)}
    assert {h["source_id"] for h in only["hits"]} == {sid} and len(only["hits"]) == 2


@pytest.mark.parametrize("window, keys", [
    ({"modified_after": "2022-01-01T00:00:00Z"}, ["new.md"]),
    ({"modified_before": "2022-01-01"}, ["old.md"]),  # no zone: UTC
    ({"modified_after": "2019-12-31T23:00:00+02:00", "modified_before": "2024-06-01T00:00:00"}, ["old.md"]),
    ({"modified_after": "2024-06-01T00:00:00+00:00"}, ["new.md"]),  # at/after is inclusive
])
async def test_modified_after_and_before_filter_by_the_files_mtime(world, window, keys):
    hits = (await call(world, "search_content", {"query": "quokka", **window}))["hits"]
    assert sorted(h["key"] for h in hits) == keys


async def test_a_hit_carries_its_neighbour_chunks_within_1800_characters_and_says_truncated(world):
    [hit] = (await call(world, "search_content", {"query": "okapi", "source_id": str(world["main"].source_id)}))["hits"]
    window = await call(world, "get_file_window", {"source_id": hit["source_id"], "key": "long.txt",
                                                   "start": hit["seq"] - 1, "length": 3})
    prev, own, nxt = window_chunk_texts(window)
    assert own in hit["text"] and len(hit["text"]) <= 1800
    assert hit["truncated"] is True  # three ~1,000-character chunks do not fit
    before, _, after = hit["text"].partition(own)
    assert prev.endswith(before.strip("\n").lstrip("…")) and nxt.startswith(after.strip("\n").rstrip("…"))
    assert before and after


async def test_a_short_hit_carries_whole_neighbours_and_is_not_truncated(owner_engine, worker_engine, owner_url,
                                                                        tmp_path, world):
    root = tmp_path / "small-chunks"
    root.mkdir()
    (root / "three.txt").write_text("\n\n".join(f"Paragraph {w} " + "word " * 40 for w in ("alpha", "narwhal", "omega")))
    source = admin.add_source(db_of(owner_engine), "contract", protocol="fs", config={"root": str(root)},
                              name="small")
    [loaded] = load_sources(db_of(worker_engine), source_id=source.id)
    Indexer(db_of(worker_engine), Settings(chunk_target_chars=100, chunk_max_chars=300)).crawl(loaded)
    [hit] = (await call(world, "search_content", {"query": "narwhal", "source_id": str(source.id)}))["hits"]
    assert hit["truncated"] is False and hit["seq"] == 1
    assert hit["text"].startswith("Paragraph alpha") and hit["text"].rstrip().endswith("word")
    assert "Paragraph omega" in hit["text"] and len(hit["text"]) <= 1800


async def test_get_file_window_reads_40_chunks_by_default_within_16000_characters(world):
    ref = {"source_id": str(world["main"].source_id), "key": "long.txt"}  # chunks of ~1,000 characters
    window = await call(world, "get_file_window", ref)
    assert 12 <= window["window"]["returned"] < 40 and window["window"]["chars"] <= 16_000 and window["has_more"]
    assert window["window"]["chars"] == len(window["text"])
    rest = await call(world, "get_file_window", {**ref, "cursor": window["next_cursor"]})
    assert rest["window"]["start"] == window["window"]["returned"]  # the budget's cut is where the cursor goes on
    wide = await call(world, "get_file_window", {**ref, "max_chars": 1_000_000})
    assert wide["window"]["returned"] == 40 and wide["has_more"] is True and wide["total_chunks"] > 40
    one = await call(world, "get_file_window", {**ref, "max_chars": 100})  # a read always advances
    assert one["window"]["returned"] == 1 and one["window"]["chars"] > 100


async def _synthetic_chunks(owner_engine, source_id, key, count, size):
    """Give an indexed file `count` chunks of `size` characters (a real crawl of 5,000+ chunks is slow)."""
    with owner_engine.begin() as conn:
        file_id = conn.execute(text("SELECT id FROM files WHERE source_id = :s AND key = :k"),
                               {"s": source_id, "k": key}).scalar_one()
        conn.execute(text("DELETE FROM chunks WHERE file_id = :f"), {"f": file_id})
        conn.execute(text("""
            INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, char_start, char_end)
            SELECT f.tenant_id, f.source_id, f.id, n, rpad('chunk ' || n || ' ', :size, 'x'), n * :size,
                   (n + 1) * :size
              FROM files f, generate_series(0, :count - 1) AS n WHERE f.id = :f"""),
                     {"f": file_id, "count": count, "size": size})
        conn.execute(text("UPDATE files SET chunk_count = :c WHERE id = :f"), {"c": count, "f": file_id})


async def test_get_file_text_returns_at_most_5000_chunks_and_says_truncated(world, owner_engine):
    sid = str(world["main"].source_id)
    await _synthetic_chunks(owner_engine, sid, "cap.md", 5003, 40)
    body = await call(world, "get_file_text", {"source_id": sid, "key": "cap.md"})
    assert len(body["chunks"]) == 5000 and body["total_chunks"] == 5003
    assert body["truncated"] is True and body["next_start"] == 5000
    rest = await call(world, "get_file_window", {"source_id": sid, "key": "cap.md", "start": body["next_start"]})
    assert [c["seq"] for c in rest["chunks"]] == [5000, 5001, 5002]


async def test_get_file_text_sends_the_text_once_per_kind_of_client_and_at_most_1_mb(world, owner_engine):
    sid = str(world["main"].source_id)
    await _synthetic_chunks(owner_engine, sid, "big.md", 3000, 1000)  # 3 MB of text
    request = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "get_file_text", "arguments": {"source_id": sid, "key": "big.md"}}}
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{world['url']}/mcp", json=request, headers={
            "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream"})
    result = resp.json()["result"]
    body = result["structuredContent"]
    returned = sum(len(c["text"]) for c in body["chunks"])
    assert body["truncated"] is True and 900_000 < returned <= 1_000_000
    assert body["next_start"] == len(body["chunks"]) and body["total_chunks"] == 3000
    summary, embedded = result["content"]
    assert len(summary["text"]) < 2_000 and json.loads(summary["text"])["chunks_returned"] == len(body["chunks"])
    assert len(embedded["resource"]["text"]) == returned + 2 * (len(body["chunks"]) - 1)
    # the text twice (structuredContent for clients that read it, the resource for the others), not three
    # times: the whole response was 9.5 MB for a 3 MB file, now ~2 MB
    assert len(resp.content) < 2.3 * returned


async def test_list_sources_and_list_files_page_50_by_default_and_200_at_most(world):
    sid = str(world["main"].source_id)
    sources = await call(world, "list_sources", {})
    assert len(sources["sources"]) == 50 and sources["next_cursor"]
    everything = await call(world, "list_sources", {"limit": 200})
    assert 54 <= len(everything["sources"]) <= 200 and everything["next_cursor"] is None
    listed = await call(world, "list_files", {"source_id": sid})
    assert len(listed["files"]) == 50 and listed["next_cursor"]
    assert len((await call(world, "list_files", {"source_id": sid, "limit": 200}))["files"]) == 63
    async with mcp(world) as client:
        for tool, args in (("list_sources", {}), ("list_files", {"source_id": sid})):
            with pytest.raises(MCPError) as err:
                await client.call_tool(tool, {**args, "limit": 201})
            assert err.value.code == -32602 and "'limit'" in err.value.message


async def test_a_download_link_lives_about_15_minutes(world):
    [hit] = (await call(world, "search_content", {"query": "okapi"}))["hits"]
    assert hit["url"].startswith("http://kdbl.example/api/files/download?t=")
    claims = jwt.decode(hit["url"].split("t=", 1)[1], options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 900 and claims["key"] == "long.txt"


async def test_the_audit_row_names_the_sources_read_and_the_time_of_the_call(world, owner_engine):
    sid = str(world["other"].source_id)
    with owner_engine.connect() as conn:
        start = conn.execute(text("SELECT now()")).scalar_one()
    await call(world, "search_content", {"query": "quokka", "source_id": sid})
    with owner_engine.connect() as conn:
        row = conn.execute(text("SELECT ts, source_ids, keys, status, tool FROM audit WHERE tool = 'search_content'"
                                " AND arguments->>'query' = 'quokka' AND arguments ? 'source_id'"
                                " ORDER BY id DESC LIMIT 1")).one()
        end = conn.execute(text("SELECT now()")).scalar_one()
    assert [str(s) for s in row.source_ids] == [sid] and sorted(row._mapping["keys"]) == ["new.md", "old.md"]
    assert start <= row.ts <= end and row.status == "ok"
