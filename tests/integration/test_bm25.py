"""The keyword arm is real BM25: exact scores against a reference computation, rarity beats density."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from helpers import crawl, make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import lexical

DOCS = {
    "a.txt": "aspirin reduces fever. aspirin is common.",
    "b.txt": "fever fever fever and headache in the clinic",
    "c.txt": "the zygomycosis case report describes a rare fungal infection",
    "d.txt": "headache treatment with ibuprofen or aspirin",
    "e.txt": "clinic opening hours and parking information",
}


@pytest.fixture
def corpus(owner_engine, worker_engine, tmp_path, unique):
    return make_corpus(owner_engine, worker_engine, tmp_path / f"bm-{unique}", DOCS, tenant=f"bm-{unique}")


async def _search(api_pool, corpus, query, **kw):
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        hits = await lexical.search(conn, query, lexical.Filters(**kw), limit=10, ts_config="english")
        terms = {}
        for row in await (await conn.execute(
                "SELECT f.key, p.term, p.tf, p.dl FROM postings p JOIN files f ON f.id = p.file_id")).fetchall():
            terms.setdefault(row.key, {})[row.term] = (row.tf, row.dl)
        qterms = await lexical.query_terms(conn, query, "english")
    return hits, terms, qterms


def _reference_bm25(postings, qterms, k1=1.2, b=0.75):
    n = len(postings)
    avgdl = sum(next(iter(t.values()))[1] for t in postings.values()) / n
    df = Counter(term for terms in postings.values() for term in terms)
    scores = {}
    for key, terms in postings.items():
        score = 0.0
        for term in qterms:
            if term in terms:
                tf, dl = terms[term]
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))
        if score > 0:
            scores[key] = score
    return scores


async def test_scores_equal_a_reference_bm25(api_pool, corpus):
    hits, postings, qterms = await _search(api_pool, corpus, "aspirin fever headache")
    expected = _reference_bm25(postings, qterms)
    assert {h.key: pytest.approx(h.score, rel=1e-9) for h in hits} == expected
    assert [h.key for h in hits] == sorted(expected, key=lambda k: -expected[k])


async def test_a_rare_decisive_term_outranks_a_dense_common_one(api_pool, owner_engine, worker_engine,
                                                                tmp_path, unique):
    files = {f"ward-{i}.txt": f"patient {i} has fever; fever checked twice" for i in range(30)}
    files["rare.txt"] = "one zygomycosis case, a rare fungal infection with fever"
    files["dense.txt"] = "fever fever fever fever fever"
    big = make_corpus(owner_engine, worker_engine, tmp_path / f"rare-{unique}", files, tenant=f"rare-{unique}")
    hits, _, _ = await _search(api_pool, big, "fever zygomycosis")
    assert hits[0].key == "rare.txt"
    assert len(hits) == 10  # OR semantics: fever-only chunks still match


async def test_query_of_only_unknown_or_stop_words_returns_nothing(api_pool, corpus):
    assert (await _search(api_pool, corpus, "the and of"))[0] == []
    assert (await _search(api_pool, corpus, "qwertyuiop"))[0] == []


async def test_path_filter_applies_before_the_top_n(api_pool, corpus):
    hits, _, _ = await _search(api_pool, corpus, "aspirin headache", path="d")
    assert [h.key for h in hits] == ["d.txt"]


async def test_statistics_stay_exact_through_edits_and_deletes(owner_engine, worker_engine, corpus):
    (corpus.root / "a.txt").write_text("completely different words now: quasar pulsar")
    (corpus.root / "b.txt").unlink()
    (corpus.root / "f.txt").write_text("aspirin again")
    stats = crawl(worker_engine, corpus)
    assert (stats.indexed, stats.deleted) == (2, 1)
    with owner_engine.connect() as conn:
        drift = conn.execute(text("""
            WITH truth AS (SELECT term, count(*) AS df FROM postings WHERE tenant_id = :t GROUP BY term),
                 kept AS (SELECT term, sum(df) AS df FROM term_stats WHERE tenant_id = :t GROUP BY term)
            SELECT count(*) FROM truth FULL JOIN kept USING (term)
             WHERE coalesce(truth.df, 0) <> coalesce(kept.df, 0)"""), {"t": corpus.tenant_id}).scalar()
        corpus_row = conn.execute(text(
            "SELECT sum(n_chunks) n, sum(total_len) l FROM corpus_stats WHERE tenant_id = :t"),
            {"t": corpus.tenant_id}).one()
        truth = conn.execute(text(
            "SELECT count(*) n, sum(token_count) l FROM chunks WHERE tenant_id = :t"), {"t": corpus.tenant_id}).one()
    assert drift == 0
    assert tuple(corpus_row) == tuple(truth)


@pytest.mark.asyncio
async def test_common_terms_only_score_the_candidates_rarer_terms_found(owner_engine, worker_engine, tmp_path,
                                                                        unique, api_pool):
    files = {f"c{i:02}.txt": f"common clinic notes number {i}" for i in range(12)}
    files |= {"r1.txt": "common okapi sighting", "r2.txt": "okapi okapi common common", "r3.txt": "okapi alone"}
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"ct-{unique}", files, tenant=f"ct-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        exact = await lexical.search(conn, "common okapi", lexical.Filters(), limit=10, ts_config="english")
        pruned = await lexical.search(conn, "common okapi", lexical.Filters(), limit=10, ts_config="english",
                                      common_df=5)  # "common" has 14 postings: scored on candidates only
    exact_scores = {h.key: h.score for h in exact}
    assert len(exact) == 10 and {h.key for h in exact[:3]} == {"r1.txt", "r2.txt", "r3.txt"}
    # the okapi chunks keep their full scores (common term included) and their order ...
    assert [h.key for h in pruned] == [h.key for h in exact[:3]]
    assert all(h.score == pytest.approx(exact_scores[h.key]) for h in pruned)
    # ... and chunks holding only the common term are never read, so never returned
    assert all(h.key.startswith("r") for h in pruned)
