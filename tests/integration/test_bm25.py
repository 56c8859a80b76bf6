"""The keyword arm is real BM25: exact scores against a reference computation, rarity beats density."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from helpers import POSTINGS, crawl, grants_world, make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import store
from kdbl_core.search import bm25_topk, lexical

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
        hits = await bm25_topk.search(conn, query, lexical.Filters(**kw), limit=10, ts_config="english")
        terms = {}
        for row in await (await conn.execute(
                f"SELECT f.key, p.term, p.tf, p.dl FROM {POSTINGS} p JOIN files f ON f.id = p.file_id")).fetchall():
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
        drift = conn.execute(text(f"""
            WITH truth AS (SELECT term, count(*) AS df FROM {POSTINGS} p WHERE tenant_id = :t GROUP BY term),
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


def _zipf_corpus(seed: int, docs: int = 240, words: int = 30) -> tuple[dict[str, str], list[str]]:
    """Files of words drawn from a Zipf-like vocabulary: a few terms in most chunks, many in a few."""
    rng = random.Random(seed)
    vocab = [f"w{i}x" for i in range(300)]
    weights = [1 / (i + 1) for i in range(len(vocab))]
    files = {f"d{n:03}.txt": " ".join(rng.choices(vocab, weights, k=rng.randint(5, words * 2)))
             for n in range(docs)}
    return files, vocab


@pytest.mark.asyncio
async def test_maxscore_returns_the_exhaustive_top_k_while_skipping_common_terms(owner_engine, worker_engine,
                                                                                 tmp_path, unique, api_pool,
                                                                                 monkeypatch):
    monkeypatch.setattr(bm25_topk, "SMALL_POSTINGS", 0)  # this corpus is small: MaxScore all the same

    async def no_extension(conn) -> bool:
        return False

    # MaxScore serves databases without kdbl_bm25, whose writers write postings rows and never pack
    monkeypatch.setattr(bm25_topk.bm25_native, "require_readable", no_extension)
    monkeypatch.setattr(store, "writes_packed", lambda conn: False)
    files, vocab = _zipf_corpus(7)
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"ms-{unique}", files, tenant=f"ms-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    rng = random.Random(11)
    skipped = 0
    for n in range(60):
        query = " ".join(rng.sample(vocab[:3], 2) + rng.sample(vocab[3:60], rng.randint(1, 4)))
        limit = (3, 5, 10, 21)[n % 4]
        filters = lexical.Filters(path="d0") if n % 5 == 0 else lexical.Filters()
        stats: dict = {}
        async with rls_transaction(api_pool, principal) as conn:
            fast = await bm25_topk.search(conn, query, filters, limit=limit, ts_config="english", stats=stats,
                                          native=False)
            full = await bm25_topk.search(conn, query, filters, limit=limit, ts_config="english", exhaustive=True)
        assert [h.chunk_id for h in fast] == [h.chunk_id for h in full], query
        assert [h.score for h in fast] == pytest.approx([h.score for h in full], rel=1e-12)
        assert all(h.key.startswith("d0") for h in fast) if filters.path else len(fast) == limit
        skipped += stats["non_essential"] > 0
    assert skipped >= 20  # the common terms were left out of the read, not merely rescored
    monkeypatch.setattr(bm25_topk, "SMALL_POSTINGS", 10**9)  # the one-statement path: the same answer
    async with rls_transaction(api_pool, principal) as conn:
        small = await bm25_topk.search(conn, query, filters, limit=limit, ts_config="english", stats=stats,
                                       native=False)
    assert [h.chunk_id for h in small] == [h.chunk_id for h in full] and stats["small"]


@pytest.mark.asyncio
async def test_a_principal_granted_one_file_gets_its_own_top_k_not_what_is_left_of_everybodys(
        owner_engine, worker_engine, tmp_path, unique, api_pool, monkeypatch):
    monkeypatch.setattr(bm25_topk, "SMALL_POSTINGS", 0)
    restricted, _ = _zipf_corpus(3)
    restricted["mine.txt"] = "w0x w1x w2x"  # only common terms: far below the whole source's top k
    ids = grants_world(owner_engine, worker_engine, tmp_path / f"mo-{unique}", prefix=f"mo-{unique}",
                       open_files={"open.txt": "w1x and other words"}, restricted=restricted,
                       granted="mine.txt", other=restricted)
    with owner_engine.connect() as conn:
        tenant_id = conn.execute(text("SELECT id FROM tenants WHERE name = :n"), {"n": ids["tenant"]}).scalar()
    alice = Principal(tenant_id=tenant_id, tenant_name=ids["tenant"], subject="user:alice")
    async with rls_transaction(api_pool, alice) as conn:
        mine = await bm25_topk.search(conn, "w0x w1x w2x", lexical.Filters(), limit=5, ts_config="english",
                                      native=False)
        full = await bm25_topk.search(conn, "w0x w1x w2x", lexical.Filters(), limit=5, ts_config="english",
                                      exhaustive=True)
    assert [h.key for h in mine] == [h.key for h in full] == ["mine.txt", "open.txt"]


@pytest.mark.asyncio
async def test_score_bounds_stay_valid_through_edits_and_deletes(owner_engine, worker_engine, tmp_path, unique):
    files, _ = _zipf_corpus(5, docs=40)
    root = tmp_path / f"bd-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, root, files, tenant=f"bd-{unique}")
    with owner_engine.connect() as conn:  # terms whose largest tf only the chunks about to change hold
        replaced = set(conn.execute(text(f"""
            SELECT p.term FROM {POSTINGS} p JOIN files f ON f.id = p.file_id WHERE p.tenant_id = :t
             GROUP BY p.term HAVING max(p.tf) FILTER (WHERE f.key IN ('d000.txt', 'd001.txt', 'd002.txt'))
                                    > coalesce(max(p.tf) FILTER (WHERE f.key NOT IN ('d000.txt', 'd001.txt',
                                                                                    'd002.txt')), 0)"""),
            {"t": corpus.tenant_id}).scalars())
    (root / "d000.txt").write_text("w0x " * 40 + "w250x")  # a larger tf than any the corpus had
    (root / "d001.txt").write_text("w7x")  # a shorter chunk
    (root / "d002.txt").unlink()
    crawl(worker_engine, corpus)
    with owner_engine.connect() as conn:
        loose = conn.execute(text(f"""
            WITH truth AS (SELECT term, max(tf) AS tf FROM {POSTINGS} p WHERE tenant_id = :t GROUP BY term),
                 kept AS (SELECT term, max(tf_max) AS tf FROM term_stats WHERE tenant_id = :t GROUP BY term)
            SELECT count(*) FILTER (WHERE kept.tf IS NULL OR kept.tf < truth.tf),
                   array_remove(array_agg(CASE WHEN kept.tf > truth.tf THEN term END), NULL)
              FROM truth LEFT JOIN kept USING (term)"""), {"t": corpus.tenant_id}).one()
        dl = conn.execute(text("""
            SELECT (SELECT min(dl_min) FROM corpus_stats WHERE tenant_id = :t),
                   (SELECT min(token_count) FROM chunks WHERE tenant_id = :t),
                   (SELECT c.token_count FROM chunks c JOIN files f ON f.id = c.file_id
                     WHERE f.tenant_id = :t AND f.key = 'd001.txt')"""), {"t": corpus.tenant_id}).one()
    assert loose[0] == 0  # no term's bound below a posting's tf: never a wrong bound
    assert set(loose[1]) <= replaced  # and tight, but for terms whose largest posting was replaced
    assert conn is not None and dl[0] is not None and dl[0] <= dl[1] == dl[2]  # d001.txt: now the shortest
