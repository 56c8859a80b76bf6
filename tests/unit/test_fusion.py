"""Fusion, score rerank and diversification of the two arms (pure functions of their inputs)."""

from __future__ import annotations

import uuid

from kdbl_core.search import hybrid
from kdbl_core.search.lexical import ChunkHit

SOURCE = uuid.uuid4()


def hit(chunk_id: int, score: float, file_id: int | None = None, seq: int = 0) -> ChunkHit:
    return ChunkHit(chunk_id, file_id if file_id is not None else chunk_id, SOURCE, f"k{chunk_id}", seq, score)


def test_rrf_adds_both_arms_and_ranks_by_the_sum() -> None:
    fused = hybrid.fuse([hit(1, 9.0), hit(2, 5.0)], [hit(2, 0.9), hit(3, 0.8)], k=60)
    assert [f.hit.chunk_id for f in fused] == [2, 1, 3]
    assert fused[0].lexical_rank == 2 and fused[0].vector_rank == 1


def test_score_rerank_uses_complete_scores_not_ranks() -> None:
    # chunk 3 is only the vector arm's 2nd hit, but its exact BM25 (looked up) is nearly the best
    fused = hybrid.fuse([hit(1, 10.0), hit(2, 9.0)], [hit(2, 0.50), hit(3, 0.49)], k=60)
    lexical_scores = {1: 10.0, 2: 9.0, 3: 9.8}
    vector_scores = {1: 0.10, 2: 0.50, 3: 0.49}
    ranked = hybrid.rescore(fused, lexical_scores, vector_scores, lexical_weight=0.4)
    assert [f.hit.chunk_id for f in ranked] == [3, 2, 1]  # 0.4·0.8 + 0.6·0.975 > 0.6·1.0 > 0.4·1.0
    assert ranked[0].lexical_score == 9.8 and ranked[0].vector_score == 0.49
    # the weight moves it: all lexical -> BM25 order
    ranked = hybrid.rescore(fused, lexical_scores, vector_scores, lexical_weight=1.0)
    assert [f.hit.chunk_id for f in ranked] == [1, 3, 2]


def test_score_rerank_keeps_pinned_identifiers_first_and_handles_missing_scores() -> None:
    fused = hybrid.fuse([hit(1, 1.0)], [hit(2, 0.9), hit(3, 0.8)], pinned_chunks={1})
    ranked = hybrid.rescore(fused, {1: 1.0}, {2: 0.9, 3: 0.8}, lexical_weight=0.5)
    assert ranked[0].hit.chunk_id == 1 and ranked[0].pinned
    assert ranked[0].vector_score is None and ranked[1].lexical_score is None


def test_an_arm_that_scored_one_candidate_still_prefers_it() -> None:
    # only chunk 2 contains the query's words: the lexical arm must lift it above chunk 3
    fused = hybrid.fuse([hit(2, 4.0)], [hit(3, 0.61), hit(2, 0.60)], k=60)
    ranked = hybrid.rescore(fused, {2: 4.0}, {2: 0.60, 3: 0.61}, lexical_weight=0.6)
    assert [(f.hit.chunk_id, round(f.score, 6)) for f in ranked] == [(2, 0.6), (3, 0.4)]  # 0.6·1 + 0.4·0, 0.6·0 + 0.4·1
    # a lone hit scores 1, not 0
    alone = hybrid.rescore(hybrid.fuse([hit(5, 2.0)], [hit(5, 0.3)], k=60), {5: 2.0}, {5: 0.3}, lexical_weight=0.5)
    assert alone[0].score == 1.0


def test_diversify_caps_hits_per_file_and_skips_neighbours() -> None:
    ranked = hybrid.fuse([hit(1, 9, file_id=7, seq=0), hit(2, 8, file_id=7, seq=1), hit(3, 7, file_id=7, seq=5),
                          hit(4, 6, file_id=7, seq=9), hit(5, 5, file_id=8)], [])
    chosen = hybrid.diversify(ranked, limit=10, max_per_file=2)
    assert [f.hit.chunk_id for f in chosen] == [1, 3, 5]
