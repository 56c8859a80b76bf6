"""search_content's cursors and result cache through the official MCP client (issue 16): pages that neither
repeat nor skip a hit, cursors refused when stale, altered or another principal's, and a cache whose
answer is never one a fresh query would not give (a re-crawled edit, a revoked grant, a policy change)."""

from __future__ import annotations

import uuid

import jsonschema
import pytest
from helpers import crawl, db_of, make_corpus, mcp_client, running_api
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

# 24 files that all hold "quokka", with different counts so BM25 orders them; "wombat" in 3 of them
FILES = {f"note-{i:02d}.md": ("quokka " * (1 + i % 7)) + f"field note {i} about island marsupials"
         + (" wombat" if i % 8 == 0 else "") for i in range(24)}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"pages-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("pages") / "kb", FILES, tenant=name)
    restricted = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("pages") / "vault",
                             {"vault.md": "The numbat treasury ledger."}, tenant=name, restricted=True)
    owner = db_of(owner_engine)
    grant = admin.add_grant(owner, source_id=restricted.source_id, subject="group:finance", force=True)
    agent = admin.create_token(owner, tenant_name=name, name="agent", groups=["finance"])[0]
    other = admin.create_token(owner, tenant_name=name, name="other")[0]
    with running_api(owner_url, Settings(mcp_enabled=True, hybrid_depth=10)) as url:
        yield {"url": url, "agent": agent, "other": other, "corpus": corpus, "restricted": restricted,
               "grant": grant, "owner": owner, "tenant": name, "worker_engine": worker_engine}


mcp = mcp_client


async def search(world, token: str | None = None, **args) -> dict:
    async with mcp(world["url"], token or world["agent"]) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        structured = (await client.call_tool("search_content", {"mode": "lexical", **args})).structured_content
    jsonschema.validate(structured, schema)
    return structured


async def refused(world, token: str | None = None, **args) -> MCPError:
    async with mcp(world["url"], token or world["agent"]) as client:
        with pytest.raises(MCPError) as err:
            await client.call_tool("search_content", {"mode": "lexical", **args})
    return err.value


def ids(result: dict) -> list[tuple[str, int]]:
    return [(h["key"], h["seq"]) for h in result["hits"]]


async def test_pages_follow_one_ranking_without_repeats_or_gaps_until_the_candidate_cap(world):
    whole = await search(world, query="quokka", limit=10)  # the cap: max(limit, hybrid_depth=10)
    first = await search(world, query="quokka", limit=4)
    assert ids(first) == ids(whole)[:4]
    assert first["has_more"] is True and first["next_cursor"] and first["capped"] is False
    assert first["total_available"] == 5 and first["total_available_is_exact"] is False  # a lower bound
    second = await search(world, query="quokka", limit=4, cursor=first["next_cursor"])
    third = await search(world, query="quokka", limit=4, cursor=second["next_cursor"])
    assert ids(second) == ids(whole)[4:8] and ids(third) == ids(whole)[8:10]  # the cap cuts the last page
    assert third["has_more"] is False and third["next_cursor"] is None and third["capped"] is True
    assert len(set(ids(first) + ids(second) + ids(third))) == 10


async def test_response_mode_ranks_go_on_across_pages_as_positions_in_the_whole_ranking(world):
    whole = await search(world, query="quokka", limit=8, response_mode="ids_only")
    first = await search(world, query="quokka", limit=4, response_mode="ids_only")
    second = await search(world, query="quokka", limit=4, response_mode="ids_only", cursor=first["next_cursor"])
    assert [h["rank"] for h in first["hits"]] == [1, 2, 3, 4]
    assert [h["rank"] for h in second["hits"]] == [5, 6, 7, 8]
    assert [h["chunk_id"] for h in first["hits"] + second["hits"]] == [h["chunk_id"] for h in whole["hits"]]

async def test_a_search_with_fewer_hits_than_the_page_says_it_is_complete_and_exact(world):
    result = await search(world, query="wombat", limit=2)
    assert result["has_more"] is True and len(result["hits"]) == 2
    last = await search(world, query="wombat", limit=2, cursor=result["next_cursor"])
    assert len(last["hits"]) == 1 and last["has_more"] is False and last["next_cursor"] is None
    assert last["total_available"] == 3 and last["total_available_is_exact"] is True and last["capped"] is False


async def test_the_default_call_keeps_the_reference_hits_and_adds_no_cursor_when_all_fit(world):
    result = await search(world, query="wombat")
    assert len(result["hits"]) == 3 and result["has_more"] is False and result["next_cursor"] is None
    assert set(result["hits"][0]) == {"source_id", "key", "seq", "uri", "text", "truncated", "snippet", "page_no",
                                      "char_start", "char_end", "ts_start_ms", "ts_end_ms", "url", "rank"}


async def test_a_cursor_from_another_principal_query_or_altered_is_refused_naming_cursor(world):
    cursor = (await search(world, query="quokka", limit=3))["next_cursor"]
    body, mac = cursor.split(".")
    for token, args in [(world["other"], {"query": "quokka", "cursor": cursor}),
                        (None, {"query": "wombat", "cursor": cursor}),
                        (None, {"query": "quokka", "path": "note-1", "cursor": cursor}),
                        (None, {"query": "quokka", "cursor": body[:-2] + ("AA" if body[-2:] != "AA" else "BB")
                                + "." + mac})]:
        err = await refused(world, token, limit=3, **args)
        assert err.code == -32602 and "cursor" in err.message, args
    # the page size and the hit shape may change between pages
    page = await search(world, query="quokka", limit=2, cursor=cursor)
    assert len(page["hits"]) == 2


async def test_identical_queries_hit_the_cache_until_a_file_is_edited_and_re_crawled(world):
    first = await search(world, query="marsupials island", limit=5)
    again = await search(world, query="marsupials island", limit=5)
    assert first["meta"]["cache_hit"] is False and again["meta"]["cache_hit"] is True
    assert again["hits"] == first["hits"]
    assert "keyword" in first["meta"]["took_ms"] and "keyword" not in again["meta"]["took_ms"]  # no search ran
    cursor = (await search(world, query="quokka", limit=3))["next_cursor"]
    corpus = world["corpus"]
    (corpus.root / "note-05.md").write_text("marsupials island " * 30)
    crawl(world["worker_engine"], corpus)
    fresh = await search(world, query="marsupials island", limit=5)
    assert fresh["meta"]["cache_hit"] is False
    assert fresh["hits"][0]["key"] == "note-05.md" and ids(fresh) != ids(first)
    err = await refused(world, query="quokka", limit=3, cursor=cursor)
    assert err.code == -32602 and "cursor" in err.message and "stale" in err.message


async def test_a_revoked_grant_is_never_answered_from_the_cache(world):
    granted = await search(world, query="numbat treasury")
    assert [h["key"] for h in granted["hits"]] == ["vault.md"]
    assert (await search(world, query="numbat treasury"))["meta"]["cache_hit"] is True
    admin.revoke_grant(world["owner"], world["grant"].id, force=True)
    after = await search(world, query="numbat treasury")
    assert after["meta"]["cache_hit"] is False and after["hits"] == []


async def test_a_tenant_policy_change_is_never_answered_from_the_cache(world):
    await search(world, query="field note", limit=3)
    assert (await search(world, query="field note", limit=3))["meta"]["cache_hit"] is True
    admin.update_tenant(world["owner"], world["tenant"], downloads="off", force=True)
    assert (await search(world, query="field note", limit=3))["meta"]["cache_hit"] is False


async def test_the_cache_is_per_principal(world):
    await search(world, query="quokka field", limit=3)
    assert (await search(world, world["other"], query="quokka field", limit=3))["meta"]["cache_hit"] is False


@pytest.fixture(scope="module")
def hybrid_world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    name = f"hpages-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("hpages") / "kb", FILES, tenant=name)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id, batch=16) > 0
    agent = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    settings = Settings(mcp_enabled=True, hybrid_depth=12, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, "agent": agent}


@pytest.mark.parametrize("mode", ["hybrid", "semantic"])
async def test_hybrid_and_semantic_pages_follow_one_ranking_too(hybrid_world, mode):
    whole = await search(hybrid_world, query="island marsupial notes", mode=mode, limit=12)
    pages, cursor = [], None
    while True:
        page = await search(hybrid_world, query="island marsupial notes", mode=mode, limit=5,
                            **({"cursor": cursor} if cursor else {}))
        assert page["mode"] == mode
        pages += ids(page)
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert pages == ids(whole) and len(set(pages)) == len(pages) == 12 and page["capped"] is True


# ---- issue 28: cursors and cache survive ingestion that cannot change them, and only that ------------------
@pytest.fixture(scope="module")
def ingest(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    """Source `b` crawled and embedded; source `a` (FILES) crawled with 4 of its 24 chunks embedded, the rest
    pending (embedded batch by batch by the tests: a source being embedded); `vault` restricted to group
    finance. `agent` and `twin` are in finance (twin: the same view, its own cache), `outsider` is not."""
    name = f"ingest-{uuid.uuid4().hex[:10]}"
    base = tmp_path_factory.mktemp("ingest")
    worker, owner = db_of(worker_engine), db_of(owner_engine)
    b = make_corpus(owner_engine, worker_engine, base / "b", {f"b-{i}.md": f"quokka burrow survey {i} of the "
                                                               "island marsupials" for i in range(6)}, tenant=name)
    assert embed_pending(worker, embedder, tenant_id=b.tenant_id, batch=16) == 6
    a = make_corpus(owner_engine, worker_engine, base / "a", FILES, tenant=name)
    assert embed_pending(worker, embedder, tenant_id=a.tenant_id, batch=4, max_batches=1) == 4
    vault = make_corpus(owner_engine, worker_engine, base / "vault", {"v.md": "The numbat vault."}, tenant=name,
                        restricted=True)
    admin.add_grant(owner, source_id=vault.source_id, subject="group:finance", force=True)
    tokens = {who: admin.create_token(owner, tenant_name=name, name=who, groups=groups)[0]
              for who, groups in (("agent", ["finance"]), ("twin", ["finance"]), ("outsider", []))}
    settings = Settings(mcp_enabled=True, hybrid_depth=10, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, **tokens, "a": a, "b": b, "vault": vault, "worker_engine": worker_engine,
               "embed": lambda: embed_pending(worker, embedder, tenant_id=a.tenant_id, batch=4, max_batches=1)}


def add_file(world, corpus, name: str, body: str) -> None:
    (corpus.root / name).write_text(body)
    crawl(world["worker_engine"], corpus)


async def test_lexical_results_and_cursors_survive_vectors_being_written(ingest):
    first = await search(ingest, query="quokka", limit=3)
    assert (await search(ingest, query="quokka", limit=3))["meta"]["cache_hit"] is True
    assert ingest["embed"]() == 4  # a batch of vectors written while the agent pages
    again = await search(ingest, query="quokka", limit=3)
    assert again["meta"]["cache_hit"] is True and again["hits"] == first["hits"]
    assert ids(again) == ids(await search(ingest, ingest["twin"], query="quokka", limit=3))  # what a fresh search says
    second = await search(ingest, query="quokka", limit=3, cursor=first["next_cursor"])  # not stale
    assert ids(second) == ids(await search(ingest, query="quokka", limit=6))[3:]


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
async def test_vector_results_and_cursors_go_stale_when_vectors_are_written_to_a_source_they_read(ingest, mode):
    first = await search(ingest, query="island marsupial notes", mode=mode, limit=2)
    assert first["mode"] == mode and first["next_cursor"]
    assert (await search(ingest, query="island marsupial notes", mode=mode, limit=2))["meta"]["cache_hit"] is True
    assert ingest["embed"]() == 4
    assert (await search(ingest, query="island marsupial notes", mode=mode, limit=2))["meta"]["cache_hit"] is False
    err = await refused(ingest, query="island marsupial notes", mode=mode, limit=2, cursor=first["next_cursor"])
    assert err.code == -32602 and "stale" in err.message


async def test_a_vector_search_filtered_to_one_source_survives_writes_to_another(ingest):
    b = str(ingest["b"].source_id)
    first = await search(ingest, query="burrow survey", mode="semantic", source_id=b, limit=2)
    assert first["mode"] == "semantic" and first["next_cursor"]
    add_file(ingest, ingest["a"], "new-note.md", "A burrow survey of the quokka colony.")
    assert ingest["embed"]() == 4
    again = await search(ingest, query="burrow survey", mode="semantic", source_id=b, limit=2)
    assert again["meta"]["cache_hit"] is True and again["hits"] == first["hits"]
    await search(ingest, query="burrow survey", mode="semantic", source_id=b, limit=2, cursor=first["next_cursor"])


async def test_a_lexical_search_filtered_to_one_source_is_answered_afresh_when_another_source_it_sees_changes(ingest):
    """BM25's statistics span every source the caller sees: a file written to one the query filters out
    still moves its scores, so the cached answer must not be served (it was, before issue 28)."""
    a = str(ingest["a"].source_id)
    first = await search(ingest, query="quokka field", source_id=a, limit=3)
    assert (await search(ingest, query="quokka field", source_id=a, limit=3))["meta"]["cache_hit"] is True
    add_file(ingest, ingest["b"], "b-field.md", "quokka quokka field field field notes from the other source")
    fresh = await search(ingest, ingest["twin"], query="quokka field", source_id=a, limit=3)
    again = await search(ingest, query="quokka field", source_id=a, limit=3)
    assert again["meta"]["cache_hit"] is False
    assert [h["rank"] for h in again["hits"]] == [h["rank"] for h in fresh["hits"]] != [h["rank"] for h in first["hits"]]


async def test_writes_to_a_source_the_caller_cannot_see_leave_its_cache_and_cursors_alone(ingest):
    first = await search(ingest, ingest["outsider"], query="marsupials", limit=3)
    peek = await search(ingest, query="marsupials numbat", limit=3)  # the agent sees the vault
    add_file(ingest, ingest["vault"], "v2.md", "Numbat marsupials ledger, second volume.")
    again = await search(ingest, ingest["outsider"], query="marsupials", limit=3)
    assert again["meta"]["cache_hit"] is True and again["hits"] == first["hits"]
    await search(ingest, ingest["outsider"], query="marsupials", limit=3, cursor=first["next_cursor"])
    after = await search(ingest, query="marsupials numbat", limit=3)
    assert after["meta"]["cache_hit"] is False and ids(after) != ids(peek)
