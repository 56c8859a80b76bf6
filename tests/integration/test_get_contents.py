"""get_contents over MCP (official SDK client): many files and chunks in one call, answered in input order,
within a character budget, switched on by the tenant's allowlist only; an id the caller may not see
answers exactly like one that does not exist — across tenants and per-file grants (issue 17)."""

from __future__ import annotations

import uuid

import jsonschema
import pytest
from helpers import db_of, grants_world, mcp_client, running_api
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.content.uris import chunk_id, chunk_uri, file_uri
from kdbl_core.settings import Settings

LONG = "\n\n".join(f"Paragraph {i} of the long report talks about kestrel number {i} hovering over "
                   f"the meadow at dawn while the farmer counts sheep. " * 12 for i in range(12))
FILES = {"long.md": LONG, "short.txt": "Plain short note about a kestrel.\n"}
SECRET = {"open.txt": "An open note anyone may read about herons.\n",
          "hidden.txt": "A hidden ledger about herons and money.\n"}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    db = db_of(owner_engine)
    ids = grants_world(owner_engine, worker_engine, tmp_path_factory.mktemp("contents"), prefix="gc",
                       open_files=FILES, restricted=SECRET, granted="open.txt",
                       other={"theirs.txt": "The other tenant's kestrel notes.\n"})
    admin.update_tenant(db, ids["tenant"], tools="search_content,get_file_text,get_contents", force=True)
    alice = admin.create_token(db, tenant_name=ids["tenant"], name="alice", subject="user:alice")[0]
    theirs = admin.create_token(db, tenant_name=ids["other_tenant"], name="theirs")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        yield {"url": url, "alice": alice, "theirs": theirs, "a": ids["a"], "r": ids["r"], "o": ids["o"]}


def text_of(item: dict) -> str:
    """An item's text: its chunks' (the result holds each text once, issue 28)."""
    return "\n\n".join(c["text"] for c in item["chunks"])


def mcp(world, token: str):
    return mcp_client(world["url"], token)


async def call(world, token: str, **args) -> dict:
    async with mcp(world, token) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["get_contents"].output_schema
        result = await client.call_tool("get_contents", args)
    jsonschema.validate(result.structured_content, schema)
    return result.structured_content


async def test_files_and_chunks_come_back_in_input_order_in_every_id_form(world):
    a = world["a"]
    ids = [chunk_id(a, "long.md", 2), file_uri(a, "short.txt"), chunk_uri(a, "long.md", 0),
           {"source_id": str(a), "key": "short.txt"}, {"source_id": str(a), "key": "long.md", "seq": 1}]
    result = await call(world, world["alice"], ids=ids)
    items = result["items"]
    assert [i["found"] for i in items] == [True] * 5 and result["found"] == 5
    assert [i["kind"] for i in items] == ["chunk", "file", "chunk", "file", "chunk"]
    assert [i.get("seq") for i in items] == [2, None, 0, None, 1]
    assert items[0]["id"] == ids[0] and items[3]["id"] == file_uri(a, "short.txt")
    assert text_of(items[1]) == "Plain short note about a kestrel." and "text" not in items[1] and items[1]["truncated"] is False
    assert [c["seq"] for c in items[0]["chunks"]] == [2]  # no neighbours unless asked
    assert items[0]["chunk_uri"] == chunk_uri(a, "long.md", 2) and items[0]["total_chunks"] > 3


async def test_neighbours_surround_a_chunk_and_the_budget_cuts_nearest_first(world):
    a = world["a"]
    wide = await call(world, world["alice"], ids=[chunk_id(a, "long.md", 2)], expand={"neighbours": 1},
                      max_chars_per_item=100_000)
    assert [c["seq"] for c in wide["items"][0]["chunks"]] == [1, 2, 3]
    one = len(wide["items"][0]["chunks"][1]["text"])
    tight = await call(world, world["alice"], ids=[chunk_id(a, "long.md", 2)], expand={"neighbours": 1},
                       max_chars_per_item=one + 10)
    assert [c["seq"] for c in tight["items"][0]["chunks"]] == [2] and tight["items"][0]["truncated"] is True


async def test_a_file_is_cut_to_the_budget_and_says_where_to_read_on(world):
    result = await call(world, world["alice"], ids=[file_uri(world["a"], "long.md")], max_chars_per_item=2000)
    item = result["items"][0]
    assert len(text_of(item)) <= 2000 and item["truncated"] is True
    assert item["next_start"] == item["chunks"][-1]["seq"] + 1
    assert text_of(item).startswith("Paragraph 0") and item["chunks"][0]["seq"] == 0


async def test_many_ids_share_the_total_budget(world):
    ids = [file_uri(world["a"], "long.md")] * 100
    result = await call(world, world["alice"], ids=ids, max_chars_per_item=100_000)
    assert result["max_chars_per_item"] == 10_000 and len(result["items"]) == 100
    assert all(len(text_of(i)) <= 10_000 for i in result["items"])


async def test_hidden_and_missing_ids_answer_alike_across_tenants_and_per_file_grants(world):
    a, r, o = world["a"], world["r"], world["o"]
    ids = [file_uri(r, "hidden.txt"), file_uri(r, "nope.txt"),       # ungranted file vs missing file
           file_uri(o, "theirs.txt"), file_uri(uuid.uuid4(), "x.txt"),  # another tenant's vs no source
           chunk_id(r, "hidden.txt", 0), chunk_id(a, "short.txt", 99),  # hidden chunk vs missing seq
           file_uri(r, "open.txt")]                                       # the granted one
    items = (await call(world, world["alice"], ids=ids))["items"]
    strip = [{k: v for k, v in i.items() if k != "id"} for i in items[:6]]
    assert strip[0] == strip[1] == strip[2] == strip[3] and strip[4] == strip[5]
    assert strip[0] == {"found": False, "kind": "file", "reason": "not found (or not visible to you)"}
    assert items[6]["found"] is True and "open note" in text_of(items[6])


@pytest.mark.parametrize(("tool", "args"), [
    ("get_contents", {"ids": ["kdbl://file/00000000-0000-0000-0000-000000000000/theirs.txt"]}),
    ("find_similar", {"subject": {"kind": "text", "text": "kestrel"}}),
])
async def test_the_tools_beyond_the_six_exist_only_where_the_allowlist_names_them(world, tool, args):
    async with mcp(world, world["theirs"]) as client:  # the other tenant: default tools
        listed = {t.name for t in (await client.list_tools()).tools}
        with pytest.raises(MCPError) as refused:
            await client.call_tool(tool, args)
    assert tool not in listed and len(listed) == 6
    assert refused.value.code == -32602 and "unknown tool" in refused.value.message
    async with mcp(world, world["alice"]) as client:  # her tenant's allowlist names get_contents alone
        listed = {t.name for t in (await client.list_tools()).tools}
    assert listed == {"search_content", "get_file_text", "get_contents"}


@pytest.mark.parametrize(("args", "field"), [
    ({"ids": []}, "ids"),
    ({"ids": ["kdbl://file/not-a-uuid/x"]}, "ids[0]"),
    ({"ids": ["ok", "kdbl://chunk/" + str(uuid.uuid4()) + "/k/notanumber"]}, "ids[0]"),
    ({"ids": [file_uri(uuid.uuid4(), "a")] * 101}, "ids"),
    ({"ids": [file_uri(uuid.uuid4(), "a")], "max_chars_per_item": 10}, "max_chars_per_item"),
    ({"ids": [file_uri(uuid.uuid4(), "a")], "expand": {"neighbours": 11}}, "expand"),
    ({"ids": [{"source_id": str(uuid.uuid4()), "key": "a", "seq": -1}]}, "ids"),
])
async def test_bad_ids_and_bounds_are_refused_naming_the_field(world, args, field):
    async with mcp(world, world["alice"]) as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("get_contents", args)
    assert refused.value.code == -32602 and field in refused.value.message
    assert refused.value.message.count("invalid argument") == 1  # one field named, not a nested message
