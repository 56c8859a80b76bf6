"""Hybrid while the sources are partly embedded (the worker fills vectors after the crawl): never silently
worse than lexical. Candidates without a vector keep their keyword rank (hybrid.keep_keyword_slots), and
the result says `degraded` with the embedded share."""

from __future__ import annotations

import uuid

import pytest
from helpers import db_of, make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
from kdbl_core.search import pipeline
from kdbl_core.search.lexical import Filters
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

# Each topic: the file that states the answer in the query's own words (left without a vector, as if the
# worker had not reached it yet), and two files on the same topic that the worker already embedded.
TOPICS = {
    "kiln": ("The kiln firing schedule ramps to 1240 degrees over nine hours before the glaze matures.",
             ["Pottery kilns need a slow ramp so that the clay body does not crack while drying.",
              "A ceramic glaze melts into glass when the kiln reaches its peak temperature."]),
    "bees": ("Queen excluders keep the queen bee in the brood box so honey supers hold no larvae.",
             ["A beekeeper inspects the hive frames for eggs and capped brood every week.",
              "Honey is extracted from the frames of the supers with a centrifugal spinner."]),
    "tides": ("Spring tides occur when the sun and moon align, giving the largest tidal range of the month.",
              ["The moon's gravity raises a bulge of water on the side of the earth facing it.",
               "Tidal range in a harbour is measured between high water and low water marks."]),
    "bread": ("Sourdough starter is fed flour and water daily to keep its wild yeast and lactobacilli active.",
              ["Bread dough rises as yeast ferments sugars and releases carbon dioxide gas.",
               "Bakers proof loaves in a warm place before scoring and baking them."]),
    "bikes": ("Derailleur indexing is adjusted with the barrel adjuster until the chain shifts cleanly.",
              ["A bicycle chain wears and stretches, so measure it with a chain checker.",
               "Gear shifting on a road bike moves the chain across the rear cassette."]),
    "ferns": ("Fern spores develop in sori on the underside of the fronds and disperse when ripe.",
              ["Ferns grow best in moist shade with rich soil and steady humidity.",
               "Plant spores germinate into a small prothallus before a new fern grows."]),
}
QUERIES = {
    "kiln": "kiln firing schedule glaze matures",
    "bees": "queen excluder brood box honey supers",
    "tides": "spring tides sun and moon align tidal range",
    "bread": "sourdough starter fed flour and water daily yeast",
    "bikes": "derailleur indexing barrel adjuster chain shifts",
    "ferns": "fern spores sori underside of fronds",
}


@pytest.fixture(scope="module")
def corpus(owner_engine, worker_engine, tmp_path_factory, embedder):
    files = {}
    for topic, (target, related) in TOPICS.items():
        files[f"{topic}/answer.md"] = target
        for i, body in enumerate(related):
            files[f"{topic}/related-{i}.md"] = body
    made = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("partial") / "kb", files,
                       tenant=f"partial-{uuid.uuid4().hex[:8]}")
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=made.tenant_id, batch=32) == len(files)
    with owner_engine.begin() as conn:  # the answers' vectors not there yet: the worker is still at it
        cleared = conn.execute(text(
            "UPDATE chunks c SET embedding = NULL, embedding_model = NULL FROM files f "
            "WHERE f.id = c.file_id AND c.source_id = :s AND f.key LIKE '%/answer.md'"), {"s": made.source_id})
        assert cleared.rowcount == len(TOPICS)
    return made


async def _ranks(api_pool, corpus, embedder, mode: str) -> tuple[dict[str, int | None], list]:
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:partial",
                          scopes=frozenset(ALL_SCOPES))
    ranks, results = {}, []
    for topic, query in QUERIES.items():
        async with rls_transaction(api_pool, principal) as conn:
            result = await SearchPlan(pipeline.SearchRequest(query=query, mode=mode, limit=5),
                                      settings=Settings(), embedder=embedder).run(conn)
        keys = [h["key"] for h in result.hits]
        ranks[topic] = keys.index(f"{topic}/answer.md") + 1 if f"{topic}/answer.md" in keys else None
        results.append(result)
    return ranks, results


def _mrr(ranks: dict[str, int | None]) -> float:
    return sum(1 / r for r in ranks.values() if r) / len(ranks)


async def test_hybrid_over_a_half_embedded_tenant_keeps_the_exact_matches_where_lexical_ranks_them(
        api_pool, corpus, embedder):
    lexical, _ = await _ranks(api_pool, corpus, embedder, "lexical")
    hybrid, _ = await _ranks(api_pool, corpus, embedder, "hybrid")
    assert set(lexical.values()) == {1}  # the keyword arm finds every answer first
    assert hybrid == lexical, hybrid  # the embedded related files do not push them down
    assert _mrr(hybrid) >= _mrr(lexical)


async def test_hybrid_with_candidates_lacking_vectors_says_degraded_with_the_embedded_share(
        api_pool, corpus, embedder):
    _, results = await _ranks(api_pool, corpus, embedder, "hybrid")
    for result in results:
        assert result.mode == "hybrid" and result.degraded
        assert "12 of 18 chunks searched have vectors (67%)" in result.degraded_reason, result.degraded_reason


async def test_a_hybrid_search_whose_candidates_all_have_vectors_is_not_degraded(api_pool, corpus, embedder):
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:partial",
                          scopes=frozenset(ALL_SCOPES))
    # a query whose candidates all have vectors: the related files of one topic only
    async with rls_transaction(api_pool, principal) as conn:
        result = await SearchPlan(pipeline.SearchRequest(query="beekeeper inspects hive frames", limit=3,
                                                         filters=Filters(path="bees/related")),
                                  settings=Settings(), embedder=embedder).run(conn)
    assert result.mode == "hybrid" and not result.degraded and result.hits[0]["key"] == "bees/related-0.md"
