"""search_content's response modes and field selection over MCP (official SDK client): each mode's hits
carry exactly the mode's fields and validate against the tool's outputSchema; ids_only is a small part
of full; `fields` selects; bad values are -32602 naming the field; without them the hit keeps the
reference's shape."""

from __future__ import annotations

import jsonschema
import orjson
import pytest
from helpers import crawl, hybrid_tenant_api, mcp_client, window_chunk_texts
from mcp.shared.exceptions import MCPError

from kdbl_api.tools.hit_fields import MODE_FIELDS
from kdbl_core.content.uris import parse_chunk_uri

# The reference's hit (../shared/seeds/000: source_id, key, seq, text, truncated, snippet, locators, url,
# rank) plus the kdbl:// uri it has always carried
CLASSIC = {"source_id", "key", "seq", "uri", "text", "truncated", "snippet", "page_no", "char_start", "char_end",
           "ts_start_ms", "ts_end_ms", "url", "rank"}
PARAGRAPH = ("Rotating the heliostat mirrors by small increments keeps the receiver tower evenly lit through "
             "the afternoon, and operators log every adjustment in the plant journal. ")
FILES = {
    "guide.md": "# Heliostat field guide\n\n" + "\n\n".join(f"Section {i}. {PARAGRAPH * 3}" for i in range(12)),
    "notes.txt": "Short notes: the heliostat calibration ran on Tuesday.",
    "garden.md": "Tomatoes need full sun, regular watering and support stakes.",
}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    with hybrid_tenant_api(owner_engine, worker_engine, owner_url, tmp_path_factory.mktemp("rmodes") / "kb", FILES,
                           prefix="rmodes", embedder=embedder, embed_model_path=embed_model_path) as world:
        yield world


mcp = mcp_client


async def search(world, **args) -> dict:
    async with mcp(world["url"], world["token"]) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        structured = (await client.call_tool("search_content", {"query": "heliostat", **args})).structured_content
    jsonschema.validate(structured, schema)
    return structured


async def refused(world, **args) -> MCPError:
    async with mcp(world["url"], world["token"]) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("search_content", {"query": "heliostat", **args})
    assert err.value.code == -32602
    return err.value


@pytest.mark.parametrize("mode", ["ids_only", "metadata", "preview", "full"])
async def test_each_response_mode_returns_exactly_its_fields_and_validates_against_the_output_schema(world, mode):
    result = await search(world, response_mode=mode, mode="hybrid")
    assert result["hits"] and result["mode"] == "hybrid"
    for position, hit in enumerate(result["hits"], 1):
        assert list(hit) == list(MODE_FIELDS[mode])
        assert hit["rank"] == position
    scores = [h["score"] for h in result["hits"]]
    assert scores == sorted(scores, reverse=True)


async def test_the_modes_nest_and_each_hit_names_its_chunk_its_file_and_the_files_chunk_count(world):
    full = await search(world, response_mode="full", mode="hybrid")
    ids = await search(world, response_mode="ids_only", mode="hybrid")
    assert [h["chunk_id"] for h in ids["hits"]] == [h["chunk_id"] for h in full["hits"]]
    guide = next(h for h in full["hits"] if h["key"] == "guide.md")
    assert guide["total_chunks"] > 1 and 0 <= guide["seq"] < guide["total_chunks"]
    assert guide["title"] == "Heliostat field guide" and guide["content_type"] == "text/markdown"
    assert guide["mtime"] and guide["context_header"] == "Heliostat field guide"
    assert guide["chunk_uri"] == f"kdbl://chunk/{guide['chunk_id']}"
    assert parse_chunk_uri(guide["chunk_uri"]) == (world["corpus"].source_id, "guide.md", guide["seq"])
    assert guide["uri"] == f"kdbl://file/{world['corpus'].source_id}/guide.md"
    assert 100 <= len(guide["preview"]) <= 201 and "\n" not in guide["preview"]
    assert "<mark>" in guide["snippet"] and len(guide["text"]) > len(guide["preview"])
    assert guide["scores"]["fused"] == guide["score"]
    assert guide["scores"]["keyword"] > 0 and -1.0 <= guide["scores"]["vector"] <= 1.0


async def test_the_chunk_id_is_the_same_after_an_unchanged_file_is_crawled_again(world, worker_engine):
    before = [h["chunk_id"] for h in (await search(world, response_mode="ids_only", mode="lexical"))["hits"]]
    crawl(worker_engine, world["corpus"])
    after = [h["chunk_id"] for h in (await search(world, response_mode="ids_only", mode="lexical"))["hits"]]
    assert before == after and len(set(before)) == len(before)


async def test_a_chunk_id_resolves_with_get_file_window_at_its_seq(world):
    hit = next(h for h in (await search(world, response_mode="full", mode="lexical"))["hits"] if h["key"] == "guide.md")
    source_id, key, seq = parse_chunk_uri(f"kdbl://chunk/{hit['chunk_id']}")
    async with mcp(world["url"], world["token"]) as client:
        window = (await client.call_tool("get_file_window", {"source_id": str(source_id), "key": key, "start": seq,
                                                             "length": 1})).structured_content
    assert window["chunks"][0]["seq"] == hit["seq"] and window_chunk_texts(window)[0] in hit["text"]


async def test_ids_only_costs_a_small_part_of_full(world):
    ids = await search(world, response_mode="ids_only", mode="lexical")
    full = await search(world, response_mode="full", mode="lexical")
    assert len(ids["hits"]) == len(full["hits"]) >= 2
    assert len(orjson.dumps(ids["hits"])) * 10 < len(orjson.dumps(full["hits"]))


async def test_fields_selects_hit_fields_in_the_modes_order_and_alone_picks_from_full(world):
    picked = await search(world, response_mode="metadata", fields=["title", "chunk_id", "total_chunks"])
    assert all(list(h) == ["chunk_id", "title", "total_chunks"] for h in picked["hits"])
    alone = await search(world, fields=["text", "key"])
    assert alone["hits"] and all(list(h) == ["key", "text"] for h in alone["hits"])


async def test_a_field_the_mode_does_not_offer_is_refused_naming_fields_and_listing_the_valid_ones(world):
    err = await refused(world, response_mode="ids_only", fields=["chunk_id", "text"])
    assert "fields" in err.message and "text" in err.message and "chunk_id, rank, score" in err.message
    err = await refused(world, response_mode="full", fields=["nonsense"])
    assert "fields" in err.message and "scores" in err.message


@pytest.mark.parametrize("args, field", [
    ({"response_mode": "everything"}, "response_mode"),
    ({"response_mode": 3}, "response_mode"),
    ({"fields": []}, "fields"),
    ({"fields": "chunk_id"}, "fields"),
    ({"response_mode": "full", "explain": True}, "explain"),
])
async def test_bad_response_mode_and_fields_values_are_refused_naming_the_field(world, args, field):
    err = await refused(world, **args)
    assert field in err.message


async def test_without_response_mode_the_hit_keeps_the_reference_shape(world):
    result = await search(world, mode="hybrid")
    assert result["hits"] and all(set(h) == CLASSIC for h in result["hits"])
    assert all(isinstance(h["rank"], float) for h in result["hits"])
    explained = await search(world, mode="lexical", explain=True)
    assert all(set(h) == CLASSIC | {"explain"} for h in explained["hits"])
