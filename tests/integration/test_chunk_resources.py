"""Chunk resources over MCP (official SDK client): the kdbl://chunk/ template, resources/read of a chunk with
its locators and neighbours, resources/list reporting each source's files and chunks with a cursor that
enumerates one source's chunks; nothing hidden readable or counted (issue 17)."""

from __future__ import annotations

import pytest
from helpers import db_of, grants_world, mcp_client, running_api
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.content.uris import chunk_uri
from kdbl_core.settings import Settings

BOOK = "\n\n".join(f"Chapter {i}. The lighthouse keeper logs storm number {i} in the ledger. " * 20
                   for i in range(8))


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    db = db_of(owner_engine)
    ids = grants_world(owner_engine, worker_engine, tmp_path_factory.mktemp("chunkres"), prefix="cr",
                       open_files={"book.md": BOOK, "note.txt": "A short lighthouse note.\n"},
                       restricted={"open.txt": "Open lighthouse memo.\n", "hidden.txt": "Hidden lighthouse memo.\n"},
                       granted="open.txt", other={"theirs.txt": "Another tenant's lighthouse.\n"})
    alice = admin.create_token(db, tenant_name=ids["tenant"], name="alice", subject="user:alice")[0]
    bob = admin.create_token(db, tenant_name=ids["tenant"], name="bob", subject="user:bob")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        yield {"url": url, "alice": alice, "bob": bob, "a": ids["a"], "r": ids["r"], "o": ids["o"]}


def mcp(world):
    return mcp_client(world["url"], world["alice"])


async def test_the_chunk_template_is_listed_beside_the_file_template(world):
    async with mcp(world) as client:
        templates = (await client.list_resource_templates()).resource_templates
    assert [t.name for t in templates] == ["file", "chunk"]
    assert templates[1].uri_template == "kdbl://chunk/{source_id}/{key}/{seq}"


async def test_reading_a_chunk_gives_it_first_with_locators_then_its_neighbours(world):
    uri = chunk_uri(world["a"], "book.md", 2)
    async with mcp(world) as client:
        contents = (await client.read_resource(uri)).contents
    assert [c.uri for c in contents] == [uri, chunk_uri(world["a"], "book.md", 1), chunk_uri(world["a"], "book.md", 3)]
    first = contents[0]
    assert first.meta["role"] == "chunk" and first.meta["seq"] == 2 and first.meta["total_chunks"] >= 4
    assert first.meta["char_end"] - first.meta["char_start"] == len(first.text)
    assert "Chapter" in first.text and {c.meta["role"] for c in contents[1:]} == {"neighbour"}


async def test_the_first_page_reports_each_visible_sources_counts_and_its_cursor_lists_its_chunks(world):
    async with mcp(world) as client:
        first = await client.list_resources()
        sources = {s["name"]: s for s in first.meta["kdbl/sources"]}
        book = await client.read_resource(chunk_uri(world["a"], "book.md", 0))
        listed, cursor = [], sources["a"]["chunks_cursor"]
        while cursor:
            page = await client.list_resources(cursor=cursor)
            listed += [r.uri for r in page.resources]
            cursor = page.next_cursor
    total = book.contents[0].meta["total_chunks"]
    assert set(sources) == {"a", "r"}  # never the other tenant's source
    assert (sources["a"]["files"], sources["a"]["chunks"]) == (2, total + 1)
    assert (sources["r"]["files"], sources["r"]["chunks"]) == (1, 1)  # only the granted file counts
    assert listed == [chunk_uri(world["a"], "book.md", s) for s in range(total)] + [chunk_uri(world["a"], "note.txt", 0)]


async def test_a_hidden_chunk_reads_exactly_like_a_missing_one(world):
    messages = []
    async with mcp(world) as client:
        for uri in (chunk_uri(world["r"], "hidden.txt", 0), chunk_uri(world["r"], "nope.txt", 0),
                    chunk_uri(world["o"], "theirs.txt", 0), chunk_uri(world["a"], "note.txt", 5)):
            with pytest.raises(MCPError) as refused:
                await client.read_resource(uri)
            messages.append((refused.value.code, refused.value.message))
        granted = await client.read_resource(chunk_uri(world["r"], "open.txt", 0))
    assert len(set(messages)) == 1 and messages[0][0] == -32602 and "uri" in messages[0][1]
    assert granted.contents[0].text == "Open lighthouse memo."


async def test_a_chunk_cursor_is_bound_to_its_principal_and_tamper_evident(world):
    async with mcp(world) as client:
        cursor = (await client.list_resources()).meta["kdbl/sources"][0]["chunks_cursor"]
        with pytest.raises(MCPError) as tampered:
            await client.list_resources(cursor=cursor[:-3] + ("AAA" if not cursor.endswith("AAA") else "BBB"))
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {world['bob']}"})
    async with http, Client(streamable_http_client(f"{world['url']}/mcp", http_client=http)) as bob:
        with pytest.raises(MCPError) as foreign:
            await bob.list_resources(cursor=cursor)
    assert tampered.value.code == -32602 and "tampered" in tampered.value.message
    assert foreign.value.code == -32602 and "another principal" in foreign.value.message
