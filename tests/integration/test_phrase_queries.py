"""Phrase queries (issue 28): a quoted phrase requires its words adjacent and in order, the rest of the query
stays OR, and the hits are the exact BM25 top k of the chunks that hold the phrase — on a generated corpus
where most of the best-scoring chunks hold the phrase's words but not the phrase."""

from __future__ import annotations

import random

import pytest
from helpers import make_corpus

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import bm25_lists
from kdbl_core.db.connect import conninfo
from kdbl_core.search import bm25_native, bm25_topk, lexical, phrases, pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings

FILLER = [f"filler{c}" for c in "bcdfghjklmnpqrstvwz"] + ["orchard", "harbour", "lantern", "meadow", "quarry"]


def _files(seed: int) -> dict[str, str]:
    """300 files: 200 hold 'copper' and 'kettle' apart or reversed (short: they score high), 40 hold the
    phrase 'copper kettle' (long: they score lower), 60 hold neither; some mention 'lantern'."""
    rng = random.Random(seed)
    files = {}
    for n in range(300):
        words = rng.choices(FILLER, k=rng.randint(4, 12) if n < 200 else rng.randint(30, 80))
        if n < 100:
            words[1:1] = ["kettle", "copper"]  # reversed
        elif n < 200:
            words[1:1] = ["copper", rng.choice(FILLER), "kettle"]  # apart
        elif n < 240:
            at = rng.randint(0, len(words))
            words[at:at] = ["copper", "kettle"] * rng.randint(1, 2)
        files[f"doc{n:03}.txt"] = " ".join(words) + "."
    return files


@pytest.fixture(scope="module")
def corpus(owner_engine, worker_engine, tmp_path_factory):
    return make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("phrases"), _files(28),
                       tenant="phrases")


def _principal(corpus) -> Principal:
    return Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")


async def _search(api_pool, corpus, query: str, *, limit: int = 10, **kw) -> list[lexical.ChunkHit]:
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        return await bm25_topk.search(conn, query, lexical.Filters(**kw), limit=limit, ts_config="english")


async def _reference(api_pool, corpus, query: str, holds) -> list[lexical.ChunkHit]:
    """The unquoted query's exhaustive ranking (every match), kept where `holds(text)`."""
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        ranked = await bm25_topk.search(conn, query.replace('"', " "), lexical.Filters(), limit=10_000,
                                        ts_config="english", exhaustive=True)
        cur = await conn.execute("SELECT id, text FROM chunks WHERE id = ANY(%(ids)s)",
                                 {"ids": [h.chunk_id for h in ranked]})
        text_of = dict(await cur.fetchall())
    return [h for h in ranked if holds(text_of[h.chunk_id])]


def _holds_copper_kettle(text: str) -> bool:
    return "copper kettle" in text


async def test_a_quoted_phrase_requires_its_words_adjacent_and_in_order(api_pool, corpus):
    loose = await _search(api_pool, corpus, "copper kettle", limit=300)
    quoted = await _search(api_pool, corpus, '"copper kettle"', limit=300)
    assert len(loose) == 240  # OR: every chunk holding either word
    assert {h.key for h in quoted} == {f"doc{n:03}.txt" for n in range(200, 240)}
    assert all(h.key < "doc200.txt" for h in loose[:10])  # unquoted, the short reversed/apart ones win


async def test_phrase_hits_are_the_exact_top_k_of_the_chunks_that_hold_the_phrase(api_pool, corpus):
    for query, grows in (('"copper kettle"', True), ('lantern "copper kettle" meadow', False)):
        expected = await _reference(api_pool, corpus, query, _holds_copper_kettle)
        assert len(expected) == 40
        for limit in (1, 5, 10, 40, 100):
            stats: dict = {}
            async with rls_transaction(api_pool, _principal(corpus)) as conn:
                hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=limit, ts_config="english",
                                              stats=stats)
            assert [h.chunk_id for h in hits] == [h.chunk_id for h in expected[:limit]]
            assert [h.score for h in hits] == pytest.approx([h.score for h in expected[:limit]], rel=1e-12)
            assert stats["phrase_candidates"] == 240
            if grows and limit <= 10:  # the 64 best candidates are short chunks without the phrase
                assert stats["phrase_windows"] == 2


async def test_the_rest_of_a_phrase_query_stays_or_and_ranks_as_without_quotes(api_pool, corpus):
    hits = await _search(api_pool, corpus, '"copper kettle" lantern', limit=40)
    expected = await _reference(api_pool, corpus, '"copper kettle" lantern', _holds_copper_kettle)
    assert [h.chunk_id for h in hits] == [h.chunk_id for h in expected]
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        lantern = {r[0] for r in await (await conn.execute(
            "SELECT c.id FROM chunks c WHERE c.text LIKE '%%lantern%%'")).fetchall()}
    assert 0 < len([h for h in hits if h.chunk_id in lantern]) < len(hits)  # without 'lantern' still a hit


async def test_typographic_quotes_make_a_phrase_and_an_unpaired_quote_is_an_ordinary_character(api_pool, corpus):
    straight = await _search(api_pool, corpus, '"copper kettle"', limit=50)
    for query in ("\u201ccopper kettle\u201d", "\u201ecopper kettle\u201c", "\u201ecopper kettle\u201d"):
        assert [h.chunk_id for h in await _search(api_pool, corpus, query, limit=50)] == [
            h.chunk_id for h in straight]
    unpaired = await _search(api_pool, corpus, 'copper "kettle', limit=300)
    assert [h.chunk_id for h in unpaired] == [h.chunk_id for h in await _search(
        api_pool, corpus, "copper kettle", limit=300)]
    assert phrases.parse('say "a b" and \u201cc d\u201d or "e f') == ["a b", "c d"]
    assert phrases.parse('"" and "  "') == []


async def test_a_phrase_of_stop_words_alone_requires_nothing(api_pool, corpus):
    assert [h.chunk_id for h in await _search(api_pool, corpus, 'copper "of the" kettle', limit=300)] == [
        h.chunk_id for h in await _search(api_pool, corpus, "copper kettle", limit=300)]


async def test_a_phrase_with_a_stop_word_inside_holds_where_the_words_stand_so(
        api_pool, owner_engine, worker_engine, tmp_path, unique):
    files = {"a.txt": "The bank of America opened.", "b.txt": "America and the bank opened.",
             "c.txt": "The bank in America opened."}
    small = make_corpus(owner_engine, worker_engine, tmp_path / f"stop-{unique}", files, tenant=f"stop-{unique}")
    # phraseto_tsquery: 'bank' <2> 'america' — any one word between them, as Postgres reads the phrase
    assert sorted(h.key for h in await _search(api_pool, small, '"bank of america"')) == ["a.txt", "c.txt"]
    assert await _search(api_pool, small, '"america bank"') == []


async def test_phrase_search_is_the_same_from_the_packed_lists_from_sql_and_under_filters(
        api_pool, owner_url, corpus):
    query = '"copper kettle" lantern quarry'
    before = await _search(api_pool, corpus, query, limit=15)
    import psycopg
    with psycopg.connect(conninfo(owner_url)) as conn:
        bm25_lists.build(conn, corpus.tenant_id, "full")
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        assert await bm25_native.available(conn)
        for native, exhaustive in ((True, False), (False, False), (False, True)):
            hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=15, ts_config="english",
                                          native=native, exhaustive=exhaustive)
            assert [h.chunk_id for h in hits] == [h.chunk_id for h in before]
    filtered = await _search(api_pool, corpus, query, limit=50, path="doc22")
    assert sorted(h.key for h in filtered) == [f"doc{n}.txt" for n in range(220, 230)]


async def test_a_lexical_phrase_query_through_the_pipeline_marks_the_phrase_words(api_pool, corpus):
    async with rls_transaction(api_pool, _principal(corpus)) as conn:
        result = await SearchPlan(pipeline.SearchRequest(query='"copper kettle"', mode="lexical",
                                                         limit=5), settings=Settings()).run(conn)
    assert len(result.hits) == 5
    assert all("<mark>copper</mark> <mark>kettle</mark>" in h["snippet"] for h in result.hits)


async def test_hybrid_hits_of_a_phrase_query_all_hold_the_phrase(
        api_pool, owner_engine, worker_engine, tmp_path, unique, embedder):
    from helpers import db_of
    from kdbl_worker.vectorize import embed_pending

    files = {f"held-{n}.txt": f"Polish the copper kettle with vinegar and salt, note {n}." for n in range(4)}
    files |= {f"near-{n}.txt": f"A kettle of copper needs polishing with vinegar, note {n}." for n in range(8)}
    files |= {f"far-{n}.txt": f"Tomatoes need full sun and stakes, note {n}." for n in range(4)}
    small = make_corpus(owner_engine, worker_engine, tmp_path / f"hyb-{unique}", files, tenant=f"phyb-{unique}")
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=small.tenant_id, batch=16) == 16
    async with rls_transaction(api_pool, _principal(small)) as conn:
        for mode in ("hybrid", "semantic"):  # the vector arm knows no words: its hits are kept where the phrase holds
            request = pipeline.SearchRequest(query='"copper kettle" polishing', mode=mode, limit=10)
            quoted = await SearchPlan(request, settings=Settings(), embedder=embedder).run(conn)
            assert quoted.mode == mode and sorted(h["key"] for h in quoted.hits) == [f"held-{n}.txt" for n in range(4)]
        loose = await SearchPlan(pipeline.SearchRequest(query="copper kettle polishing", limit=10),
                                 settings=Settings(), embedder=embedder).run(conn)
        assert any(h["key"].startswith("near-") for h in loose.hits)
        ids = [r[0] for r in await (await conn.execute("SELECT id FROM chunks ORDER BY id")).fetchall()]
        assert len(await phrases.holding(conn, ids, ["copper kettle"], ts_config="english")) == 4
        assert await phrases.holding(conn, ids[:3], [], ts_config="english") == set(ids[:3])
