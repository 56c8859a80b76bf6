"""The public search modes over MCP (official SDK client): hybrid, lexical and semantic (the vector arm
alone), nothing else; semantic degrades to lexical with a reason, like hybrid."""

from __future__ import annotations

import jsonschema
import pytest
from helpers import db_of, hybrid_tenant_api, mcp_client, running_api
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.settings import Settings

MODES = {"hybrid", "lexical", "semantic", "graph"}
FILES = {
    "pets.md": "The feline rested quietly upon the woven rug by the fireplace.",
    "garden.md": "Tomatoes need full sun, regular watering and support stakes.",
    "gateway.md": "The API gateway returned a connection timeout while the upstream service was overloaded.",
    "carpets.md": "Carpet cleaning: vacuum weekly, shampoo the carpet twice a year, sleeping bags aside.",
}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    with hybrid_tenant_api(owner_engine, worker_engine, owner_url, tmp_path_factory.mktemp("modes") / "kb", FILES,
                           prefix="modes", embedder=embedder, embed_model_path=embed_model_path) as world:
        yield world


mcp = mcp_client


async def search(url: str, token: str, **args) -> dict:
    async with mcp(url, token) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        structured = (await client.call_tool("search_content", args)).structured_content
    jsonschema.validate(structured, schema)
    return structured


async def test_the_search_tool_lists_exactly_hybrid_lexical_semantic_and_graph_and_refuses_vector(world):
    async with mcp(world["url"], world["token"]) as client:
        tool = {t.name: t for t in (await client.list_tools()).tools}["search_content"]
        with pytest.raises(MCPError) as err:
            await client.call_tool("search_content", {"query": "cat", "mode": "vector"})
    assert set(tool.input_schema["properties"]["mode"]["enum"]) == MODES
    assert tool.input_schema["properties"]["mode"]["default"] == "hybrid"
    assert set(tool.output_schema["properties"]["mode"]["enum"]) == MODES
    assert err.value.code == -32602 and "'mode'" in err.value.message


async def test_semantic_returns_the_vector_arms_hits_without_any_keyword_match(world):
    query = "cat sleeping on a carpet"
    lexical = await search(world["url"], world["token"], query=query, mode="lexical")
    semantic = await search(world["url"], world["token"], query=query, mode="semantic", explain=True)
    assert "pets.md" not in [h["key"] for h in lexical["hits"]]  # no word in common
    assert semantic["mode"] == "semantic" and semantic["degraded"] is False and semantic["degraded_reason"] is None
    assert semantic["hits"][0]["key"] == "pets.md"
    explains = [h["explain"] for h in semantic["hits"]]
    assert all(e["lexical_rank"] is None and e["lexical_score"] is None for e in explains)  # no keyword arm
    ranks = [e["vector_rank"] for e in explains]
    assert ranks[0] == 1 and ranks == sorted(ranks)  # the vector arm's own order
    scores = [e["vector_score"] for e in explains]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 for s in scores)


async def test_semantic_degrades_to_lexical_with_a_reason_without_an_embedder(world, owner_url):
    with running_api(owner_url) as url:
        result = await search(url, world["token"], query="carpet", mode="semantic")
    assert result["mode"] == "lexical" and result["degraded"] is True
    assert "no embedder" in result["degraded_reason"] and result["hits"][0]["key"] == "carpets.md"


async def test_a_lexical_only_tenant_policy_serves_semantic_lexically_with_a_reason(world, owner_engine, owner_url,
                                                                                  embed_model_path):
    admin.update_tenant(db_of(owner_engine), world["tenant"], modes="lexical")
    try:  # a fresh replica reads the policy now (no cached copy)
        with running_api(owner_url, Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))) as url:
            result = await search(url, world["token"], query="carpet", mode="semantic")
    finally:
        admin.update_tenant(db_of(owner_engine), world["tenant"], modes="lexical,hybrid")
    assert result["mode"] == "lexical" and result["degraded"] is True
    assert "not allowed" in result["degraded_reason"]


async def test_capacity_lists_semantic_beside_hybrid_and_lexical_with_its_own_latency(world):
    import httpx

    await search(world["url"], world["token"], query="carpet", mode="semantic")
    async with httpx.AsyncClient() as http:
        capacity = (await http.get(f"{world['url']}/capacity",
                                   headers={"Authorization": f"Bearer {world['token']}"})).json()
    assert set(capacity["modes"]) == MODES
    semantic = capacity["modes"]["semantic"]
    assert semantic["available"] is True and semantic["dimensions"] == 384
    assert semantic["latency"]["samples"] >= 1 and "HNSW" in semantic["cost"]
