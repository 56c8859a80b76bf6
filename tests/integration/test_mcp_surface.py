"""The rest of the skills reference: window, metadata, browsing with signed cursors, resources."""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from urllib.parse import quote

import jsonschema
import pytest
from helpers import db_of, make_corpus, running_api, window_chunk_texts
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.settings import Settings

LONG = "\n\n".join(f"Section {i}. " + "lorem ipsum dolor sit amet " * 30 for i in range(30))


@pytest.fixture(scope="module")
def env(owner_engine, worker_engine, owner_url, tmp_path_factory):
    root = tmp_path_factory.mktemp("surface")
    files = {f"doc-{i:02d}.md": f"# Doc {i}\n\nnumber {i}" for i in range(7)}
    files["big/long.txt"] = LONG
    files["odd name #1 %?.txt"] = "odd but fine"
    corpus = make_corpus(owner_engine, worker_engine, root / "main-src", files, tenant="surface")
    os.chmod(corpus.root / "doc-00.md", 0o640)
    for i in range(3):
        admin.add_source(db_of(owner_engine), "surface", protocol="fs", config={"root": str(corpus.root)},
                         name=f"extra-{i}")
    other = make_corpus(owner_engine, worker_engine, root / "other-src", {"x.md": "other tenant"},
                        tenant="surface-other")
    tokens = {
        "main": admin.create_token(db_of(owner_engine), tenant_name="surface", name="reader")[0],
        "peer": admin.create_token(db_of(owner_engine), tenant_name="surface", name="peer")[0],
        "other": admin.create_token(db_of(owner_engine), tenant_name="surface-other", name="o")[0],
        "search_only": admin.create_token(db_of(owner_engine), tenant_name="surface", name="so",
                                          scopes=["kdbl.search"])[0],
    }
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        yield {"url": url, "corpus": corpus, "other": other, "tokens": tokens}


@asynccontextmanager
async def mcp(env, who="main"):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {env['tokens'][who]}"})
    async with http, Client(streamable_http_client(f"{env['url']}/mcp", http_client=http)) as client:
        yield client


async def call(client, tool, args):
    tools = {t.name: t for t in (await client.list_tools()).tools}
    result = await client.call_tool(tool, args)
    jsonschema.validate(result.structured_content, tools[tool].output_schema)
    return result


async def test_all_six_tools_are_listed_with_schemas(env):
    async with mcp(env) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == {"search_content", "get_file_text", "get_file_window", "get_file_metadata",
                          "list_sources", "list_files"}
    assert all(t.output_schema["type"] == "object" and t.annotations.read_only_hint for t in tools.values())
    assert tools["get_file_window"].input_schema["properties"]["length"]["maximum"] == 200


async def test_get_file_window_slides_with_next_cursor_to_the_end(env):
    sid = str(env["corpus"].source_id)
    async with mcp(env) as client:
        first = (await call(client, "get_file_window", {"source_id": sid, "key": "big/long.txt", "length": 3}))
        s = first.structured_content
        assert s["window"] == {"start": 0, "returned": 3, "chars": len(s["text"])}
        assert s["has_more"] and s["next_cursor"] and all("text" not in c for c in s["chunks"])  # text once
        assert window_chunk_texts(s)[0].startswith("Section 0.") and [c["seq"] for c in s["chunks"]] == [0, 1, 2]
        seen, cursor = [c["seq"] for c in s["chunks"]], s["next_cursor"]
        while cursor:
            page = (await call(client, "get_file_window", {"source_id": sid, "key": "big/long.txt", "length": 3,
                                                           "cursor": cursor})).structured_content
            seen += [c["seq"] for c in page["chunks"]]
            cursor = page["next_cursor"]
            assert page["has_more"] == bool(cursor)
        assert seen == list(range(s["total_chunks"]))
        mid = (await call(client, "get_file_window", {"source_id": sid, "key": "big/long.txt", "start": 5,
                                                      "length": 2})).structured_content
        assert [c["seq"] for c in mid["chunks"]] == [5, 6]


async def test_get_file_metadata_reports_posix_facts(env):
    async with mcp(env) as client:
        meta = (await call(client, "get_file_metadata", {"source_id": str(env["corpus"].source_id),
                                                         "key": "doc-00.md"})).structured_content
    st = os.stat(env["corpus"].root / "doc-00.md")
    assert meta["size"] == st.st_size and meta["uid"] == st.st_uid and meta["gid"] == st.st_gid
    assert meta["content_type"] == "text/markdown" and meta["status"] == "ok" and meta["owner"]
    assert meta["mode"] in {"0640", "0644"} and meta["url"] is None


async def test_list_sources_and_list_files_paginate_completely(env):
    async with mcp(env) as client:
        page = (await call(client, "list_sources", {"limit": 2})).structured_content
        names = [s["name"] for s in page["sources"]]
        while page["next_cursor"]:
            page = (await call(client, "list_sources", {"limit": 2, "cursor": page["next_cursor"]})).structured_content
            names += [s["name"] for s in page["sources"]]
        assert sorted(names) == names and set(names) == {"main-src", "extra-0", "extra-1", "extra-2"}

        sid = str(env["corpus"].source_id)
        page = (await call(client, "list_files", {"source_id": sid, "limit": 4})).structured_content
        keys = [f["key"] for f in page["files"]]
        while page["next_cursor"]:
            page = (await call(client, "list_files", {"source_id": sid, "limit": 4,
                                                      "cursor": page["next_cursor"]})).structured_content
            keys += [f["key"] for f in page["files"]]
    assert keys == sorted(keys) and len(keys) == 9 and "odd name #1 %?.txt" in keys
    assert page["files"][-1]["uri"].startswith(f"kdbl://file/{sid}/")


@pytest.mark.parametrize("mutate", ["flip", "garbage", "other_listing", "other_principal"])
async def test_forged_or_foreign_cursors_are_a_32602_error(env, mutate):
    sid = str(env["corpus"].source_id)
    async with mcp(env) as client:
        cursor = (await client.call_tool("list_files", {"source_id": sid, "limit": 2})).structured_content["next_cursor"]
    tool, args = "list_files", {"source_id": sid, "limit": 2}
    who = "main"
    if mutate == "flip":
        body, mac = cursor.split(".")
        cursor = body[:-2] + ("AA" if body[-2:] != "AA" else "BB") + "." + mac
    elif mutate == "garbage":
        cursor = "not-a-cursor"
    elif mutate == "other_listing":
        tool, args = "list_sources", {}
    else:
        who = "peer"  # same tenant, another principal
    async with mcp(env, who) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool(tool, {**args, "cursor": cursor})
    assert err.value.code == -32602 and "'cursor'" in err.value.message


async def test_list_files_of_another_tenants_source_is_unknown(env):
    async with mcp(env) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("list_files", {"source_id": str(env["other"].source_id)})
    assert err.value.code == -32602 and "source_id" in err.value.message


async def test_resources_read_returns_get_file_texts_text_typed_as_resources_list_announces_it(env):
    async with mcp(env) as client:
        listed, cursor = [], None
        while True:
            page = await client.list_resources(cursor=cursor) if cursor else await client.list_resources()
            listed += page.resources
            cursor = page.next_cursor
            if not cursor:
                break
        uris = {r.uri for r in listed}
        sid = str(env["corpus"].source_id)
        odd = f"kdbl://file/{sid}/{quote('odd name #1 %?.txt', safe='')}"
        assert odd in uris and len(uris) == 9  # the other tenant's file is not listed
        read = await client.read_resource(odd)
        [content] = read.contents
        text = (await client.call_tool("get_file_text", {"source_id": sid, "key": "odd name #1 %?.txt"}))
        [embedded] = [c for c in text.content if c.type == "resource"]
        assert content.text == embedded.resource.text == "odd but fine"
        assert content.mime_type == embedded.resource.mime_type == "text/plain"
        assert content.meta["status"] == "ok" and content.meta["truncated"] is False
        by_uri = {r.uri: r for r in listed}
        assert by_uri[odd].mime_type == "text/plain"
        md_uri = f"kdbl://file/{sid}/doc-01.md"
        markdown = (await client.read_resource(md_uri)).contents[0]
        assert by_uri[md_uri].mime_type == markdown.mime_type == "text/markdown"
        assert markdown.text == "# Doc 1\n\nnumber 1"
        templates = await client.list_resource_templates()
        assert templates.resource_templates[0].uri_template == "kdbl://file/{source_id}/{key}"
        with pytest.raises(MCPError) as err:
            await client.read_resource(f"kdbl://file/{env['other'].source_id}/x.md")
        assert err.value.code == -32602


async def test_resources_need_the_read_scope(env):
    async with mcp(env, "search_only") as client:
        with pytest.raises(Exception):
            await client.list_resources()
