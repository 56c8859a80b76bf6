"""BM25 statistics are those of what the caller sees: hidden content never moves a score (issue 13 item 4).

Each case builds two tenants with the same visible files; one of them also holds hidden files full of
the query's words (a restricted source, or other files of a source the caller sees only through per-file
grants). The caller's scores, its rare-term (identifier pinning) answer and the hybrid rerank's exact
scores must be identical in both, and equal to BM25 computed over the visible chunks alone.
"""

from __future__ import annotations

import uuid

import pytest
from helpers import POSTINGS, bm25_reference, db_of, make_corpus
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical

OPEN = {
    "a.txt": "the quarterly report mentions zebra crossings near the depot",
    "b.txt": "the quarterly report mentions giraffe crossings near the depot",
    "c.txt": "maintenance log for the depot, nothing about animals; code zx-81",
}
HIDDEN = {f"h{i:02}.txt": f"secret memo {i}: zebra zebra sighting, quarterly zx-81" for i in range(12)}
QUERY = "zebra quarterly depot"


def _tenant(owner_engine, worker_engine, tmp_path, name: str, *, hidden_source: dict[str, str] | None,
            granted_dir: dict[str, str] | None, grant_key: str | None) -> uuid.UUID:
    """A tenant with an open source; optionally a restricted source (no grants) and a restricted source
    whose file `grant_key` alone is granted to user:alice."""
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / name / "open", OPEN, tenant=name)
    if hidden_source:
        make_corpus(owner_engine, worker_engine, tmp_path / name / "hidden", hidden_source, tenant=name,
                    restricted=True)
    if granted_dir:
        part = make_corpus(owner_engine, worker_engine, tmp_path / name / "part", granted_dir, tenant=name,
                           restricted=True)
        admin.add_grant(db_of(owner_engine), source_id=part.source_id, subject="user:alice",
                        file_key=grant_key)
    return corpus.tenant_id


async def _view(api_pool, tenant_id: uuid.UUID, tenant: str, query: str = QUERY):
    """Scores by key, rare terms, the rerank's exact scores, and the visible postings (for a reference)."""
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:alice")
    async with rls_transaction(api_pool, principal) as conn:
        hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=50, ts_config="english")
        exact = await lexical.scores_for(conn, query, [h.chunk_id for h in hits], ts_config="english")
        rare = await lexical.rare_terms(conn, await lexical.query_terms(conn, "zebra zx-81", "english"))
        postings: dict[str, dict[str, tuple[int, int]]] = {}
        for row in await (await conn.execute(
                f"SELECT f.key, p.term, p.tf, p.dl FROM {POSTINGS} p JOIN files f ON f.id = p.file_id")).fetchall():
            postings.setdefault(row.key, {})[row.term] = (row.tf, row.dl)
        qterms = await lexical.query_terms(conn, query, "english")
    by_id = {h.chunk_id: h.key for h in hits}
    return ({h.key: h.score for h in hits}, sorted(rare), {by_id[i]: s for i, s in exact.items()}, postings, qterms)


async def test_a_restricted_source_the_caller_cannot_see_does_not_move_its_scores(
        owner_engine, worker_engine, api_pool, tmp_path, unique):
    bare = f"vis-bare-{unique}"
    busy = f"vis-busy-{unique}"
    bare_id = _tenant(owner_engine, worker_engine, tmp_path, bare, hidden_source=None, granted_dir=None,
                      grant_key=None)
    busy_id = _tenant(owner_engine, worker_engine, tmp_path, busy, hidden_source=HIDDEN, granted_dir=None,
                      grant_key=None)
    scores_bare, rare_bare, exact_bare, postings, qterms = await _view(api_pool, bare_id, bare)
    scores_busy, rare_busy, exact_busy, _, _ = await _view(api_pool, busy_id, busy)
    assert set(scores_busy) == {"a.txt", "b.txt", "c.txt"}
    assert scores_busy == scores_bare  # identical, not approximately
    assert scores_bare == pytest.approx(bm25_reference(postings, qterms), rel=1e-9)
    # the two files that differ by one word: the hidden zebras do not make "zebra" look common
    assert scores_busy["a.txt"] > scores_busy["b.txt"]
    assert exact_busy == exact_bare == pytest.approx(scores_bare, rel=1e-9)
    # identifier pinning counts the same way: zebra and zx-81 are in one visible chunk each (and in 12
    # hidden ones), so they stay rare for the caller
    assert rare_busy == rare_bare and "zebra" in rare_busy and len(rare_busy) >= 2


async def test_files_granted_one_by_one_count_only_themselves(owner_engine, worker_engine, api_pool,
                                                               tmp_path, unique):
    granted = {"g.txt": "granted memo: zebra seen at the depot"}
    alone = f"vis-alone-{unique}"
    among = f"vis-among-{unique}"
    alone_id = _tenant(owner_engine, worker_engine, tmp_path, alone, hidden_source=None, granted_dir=granted,
                       grant_key="g.txt")
    among_id = _tenant(owner_engine, worker_engine, tmp_path, among, hidden_source=HIDDEN,
                       granted_dir={**granted, **HIDDEN}, grant_key="g.txt")
    scores_alone, rare_alone, exact_alone, postings, qterms = await _view(api_pool, alone_id, alone)
    scores_among, rare_among, exact_among, _, _ = await _view(api_pool, among_id, among)
    assert set(scores_among) == {"a.txt", "b.txt", "c.txt", "g.txt"}
    assert scores_among == scores_alone
    assert scores_alone == pytest.approx(bm25_reference(postings, qterms), rel=1e-9)
    assert exact_among == exact_alone
    assert rare_among == rare_alone


async def test_statistics_follow_a_grant_and_a_deleted_source(owner_engine, worker_engine, api_pool,
                                                               tmp_path, unique):
    name = f"vis-grant-{unique}"
    tenant_id = _tenant(owner_engine, worker_engine, tmp_path, name, hidden_source=None, granted_dir=None,
                        grant_key=None)
    before, *_ = await _view(api_pool, tenant_id, name)
    hidden = make_corpus(owner_engine, worker_engine, tmp_path / name / "later", HIDDEN, tenant=name,
                         restricted=True)
    assert (await _view(api_pool, tenant_id, name))[0] == before
    admin.add_grant(db_of(owner_engine), source_id=hidden.source_id, subject="user:alice")
    granted, _, _, postings, qterms = await _view(api_pool, tenant_id, name)
    assert len(granted) == 3 + len(HIDDEN)  # now visible, and counted
    assert granted == pytest.approx(bm25_reference(postings, qterms), rel=1e-9)
    with owner_engine.begin() as conn:
        conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": hidden.source_id})
        left = conn.execute(text("SELECT (SELECT count(*) FROM term_stats WHERE source_id = :s) "
                                 "+ (SELECT count(*) FROM corpus_stats WHERE source_id = :s)"),
                            {"s": hidden.source_id}).scalar()
    assert left == 0
    assert (await _view(api_pool, tenant_id, name))[0] == before
