"""Search mode `graph` and hits' `rationale` (issue 31) in a real database: the query's named entities, found
whatever their case or legal suffix among the entities the caller may read, seed candidates that are fused
with the keyword arm; each hit says which of the query's words and entities it holds and its rank in each arm.
An entity named only in a hidden file seeds nothing (the search is served by keywords, saying so, exactly as
for an unknown name); entities read by the worker move the graph's index state and no other."""

from __future__ import annotations


import pytest
from helpers import db_of, entity_world
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
from kdbl_core.search import pipeline
from kdbl_core.search.lexical import Filters
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings
from kdbl_worker.entity_stage import extract_pending

OPEN = {
    "news/deal.txt": "Acme Corp. acquired Initech GmbH for $4.2 billion on 12 March 2024 in New York.",
    "news/people.txt": "Dr. Maria Rossi joined ACME Corporation in Zurich; chief executive John Smith welcomed her.",
    "news/poem.txt": "The acme of the season came late; the orchard acquired a quiet glow.",
    "news/weather.txt": "Rain is expected across the valley on Tuesday, with wind from the west.",
}
HIDDEN = {
    "board/secret.txt": "The board of Acme Corp. plans to buy Globex Corporation in Lisbon next year.",
}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, tmp_path_factory):
    return entity_world(owner_engine, worker_engine, tmp_path_factory.mktemp("graph"), {**OPEN, **HIDDEN},
                        prefix="graph", grant=("user:boss", "secret.txt"))


def _principal(world, user: str) -> Principal:
    return Principal(tenant_id=world["tenant_id"], tenant_name=world["tenant"], subject=f"user:{user}",
                     scopes=frozenset(ALL_SCOPES))


async def _search(api_pool, world, user: str, query: str, **request) -> pipeline.SearchResult:
    async with rls_transaction(api_pool, _principal(world, user)) as conn:
        return await SearchPlan(pipeline.SearchRequest(query=query, **{"mode": "graph", **request}),
                                settings=Settings()).run(conn)


async def test_the_querys_entities_seed_candidates_fused_with_the_keyword_arm(world, api_pool):
    # lower case and another legal suffix: the canonical key finds "Acme Corp." / "ACME Corporation"
    result = await _search(api_pool, world, "zed", "what did acme corp acquire", explain=True, rationale=True)
    assert result.mode == "graph" and not result.degraded
    by_file = {h["key"]: h for h in result.hits}
    assert set(by_file) == {"deal.txt", "people.txt", "poem.txt"}  # never the hidden file
    deal, people, poem = by_file["deal.txt"], by_file["people.txt"], by_file["poem.txt"]
    assert result.hits[0] is deal  # both arms: the entity and the word "acquired"
    assert deal["explain"]["graph_rank"] is not None and deal["explain"]["lexical_rank"] is not None
    # "acme" and "acquired" as common words: the keyword arm alone; ranked below the chunks naming the company
    assert poem["explain"]["graph_rank"] is None and poem["explain"]["lexical_rank"] is not None
    assert result.hits.index(poem) > result.hits.index(people)
    assert deal["rationale"] == {
        "terms": ["acme", "corp", "acquire"], "entities": [{"name": deal["rationale"]["entities"][0]["name"], "type": "ORG"}],
        "ranks": {"keyword": deal["explain"]["lexical_rank"], "vector": None, "graph": deal["explain"]["graph_rank"]},
        "pinned_identifier": False}
    assert deal["rationale"]["entities"][0]["name"] in ("Acme Corp.", "ACME Corporation")
    assert poem["rationale"]["terms"] == ["acme", "acquire"] and poem["rationale"]["entities"] == []
    assert people["rationale"]["ranks"]["graph"] is not None


async def test_several_entities_rank_the_chunks_naming_them_together_first(world, api_pool):
    result = await _search(api_pool, world, "zed", "Maria Rossi at Acme", explain=True)
    assert result.mode == "graph"
    assert result.hits[0]["key"] == "people.txt" and result.hits[0]["explain"]["graph_score"] == 2
    assert "rationale" not in result.hits[0]  # asked for only


async def test_an_entity_only_a_hidden_file_names_seeds_nothing_and_says_so_like_an_unknown_one(world, api_pool):
    hidden = await _search(api_pool, world, "zed", "Globex")
    unknown = await _search(api_pool, world, "zed", "Nonexistent Widgets")
    assert (hidden.mode, hidden.hits) == ("lexical", []) and unknown.mode == "lexical"
    assert hidden.degraded_reason == unknown.degraded_reason and "served by keywords" in hidden.degraded_reason
    granted = await _search(api_pool, world, "boss", "Globex", rationale=True)
    assert granted.mode == "graph" and [h["key"] for h in granted.hits] == ["secret.txt"]
    assert granted.hits[0]["rationale"]["entities"] == [{"name": "Globex Corporation", "type": "ORG"}]
    words = await _search(api_pool, world, "zed", "rain in the valley", rationale=True)
    assert words.mode == "lexical" and words.degraded and words.hits[0]["key"] == "weather.txt"
    assert words.hits[0]["rationale"]["terms"] == ["rain", "valley"] and words.hits[0]["rationale"]["entities"] == []
    plain = await _search(api_pool, world, "zed", "rain, the valley", mode="lexical", rationale=True)  # no entity there
    assert plain.hits[0]["rationale"]["entities"] == [] and plain.hits[0]["rationale"]["terms"] == ["rain", "valley"]


async def test_a_rationale_on_other_modes_and_the_filters_apply_to_the_entity_arm(world, api_pool):
    lexical = await _search(api_pool, world, "zed", "Initech", mode="lexical", rationale=True)
    assert lexical.mode == "lexical" and lexical.hits[0]["rationale"]["entities"][0]["name"] == "Initech GmbH"
    assert lexical.hits[0]["rationale"]["ranks"] == {"keyword": 1, "vector": None, "graph": None}
    everywhere = await _search(api_pool, world, "boss", "Acme")
    assert {h["key"] for h in everywhere.hits} >= {"deal.txt", "secret.txt"}
    only = await _search(api_pool, world, "boss", "Acme", filters=Filters(source_id=world["closed"]))
    assert [h["key"] for h in only.hits] == ["secret.txt"]


async def test_entities_read_move_the_graph_state_and_no_other(world, api_pool, owner_engine, worker_engine):
    async def prepared(mode: str = "graph") -> SearchPlan:
        plan = SearchPlan(pipeline.SearchRequest(query="Acme", mode=mode), settings=Settings())
        async with rls_transaction(api_pool, _principal(world, "zed")) as conn:
            await plan.prepare(conn)
        return plan

    with owner_engine.begin() as conn:  # an extractor that finds other entities sets the files back to unread
        conn.execute(text("UPDATE files SET entities_version = NULL WHERE source_id = :s AND key = 'deal.txt'"),
                     {"s": world["open"]})
    before = (await prepared()).states
    assert extract_pending(db_of(worker_engine)) == 1
    graph = await prepared()
    after = graph.states
    # the mentions read again moved the entities' state; content, vectors (lexical, semantic, hybrid) did not
    assert after[3] > before[3] and after[:3] == before[:3]
    assert (graph.mode, graph.state) == ("graph", max(after[0], after[3]))
    lexical = await prepared("lexical")
    assert lexical.states == after and (lexical.mode, lexical.state) == ("lexical", after[0])


async def test_graph_search_through_mcp_with_its_output_schema_cursor_and_audit(world, owner_engine, owner_url):
    from helpers import mcp_client, running_api

    db = db_of(owner_engine)
    token = admin.create_token(db, tenant_name=world["tenant"], name="graph-mcp", subject="user:zed")[0]
    with running_api(owner_url) as url:
        async with mcp_client(url, token) as client:
            tool = {t.name: t for t in (await client.list_tools()).tools}["search_content"]
            assert "graph" in tool.input_schema["properties"]["mode"]["enum"]
            assert "rationale" in tool.output_schema["$defs"]["Hit"]["properties"]
            classic = (await client.call_tool("search_content", {"query": "acme", "mode": "graph"})).structured_content
            assert classic["mode"] == "graph" and classic["hits"][0]["rationale"]["entities"]
            assert "rationale" not in (await client.call_tool(
                "search_content", {"query": "acme", "mode": "graph", "rationale": False})).structured_content["hits"][0]
            page = (await client.call_tool("search_content", {"query": "acme", "mode": "graph", "limit": 1,
                                                              "response_mode": "ids_only"})).structured_content
            assert set(page["hits"][0]) == {"chunk_id", "rank", "score", "rationale"} and page["has_more"]
            second = (await client.call_tool("search_content", {
                "query": "acme", "mode": "graph", "limit": 1, "response_mode": "ids_only",
                "cursor": page["next_cursor"]})).structured_content
            assert second["hits"][0]["chunk_id"] != page["hits"][0]["chunk_id"] and second["hits"][0]["rank"] == 2
    with owner_engine.begin() as conn:
        audited = conn.execute(text("SELECT count(*) FROM audit WHERE tenant_id = :t AND tool = 'search_content' "
                                    "AND arguments ->> 'mode' = 'graph' AND status = 'ok'"),
                               {"t": world["tenant_id"]}).scalar()
    assert audited == 4
