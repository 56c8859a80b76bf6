"""kdbl_control.ir_metrics against numbers computed by hand (BEIR / trec_eval conventions)."""

from __future__ import annotations

import pytest

from kdbl_control.ir_metrics import dedupe, evaluate, mrr_at_k, ndcg_at_k, percentile, recall_at_k

# One query, graded judgements: d1 highly relevant (2), d2 relevant (1), d3 judged non-relevant (0).
QRELS = {"d1": 2, "d2": 1, "d3": 0}
# The system ranks: 1 d3, 2 d1, 3 x (unjudged), 4 d2.
RANKING = ["d3", "d1", "x", "d2"]

# log2(2) = 1, log2(3) = 1.5849625, log2(4) = 2, log2(5) = 2.3219281
# DCG@10  = 0/1 + 2/1.5849625 + 0/2 + 1/2.3219281 = 1.2618595 + 0.4306766 = 1.6925361
# IDCG@10 = 2/1 + 1/1.5849625 = 2 + 0.6309298 = 2.6309298   (ideal: d1, d2; d3's grade 0 adds nothing)
# nDCG@10 = 1.6925361 / 2.6309298 = 0.6433224
NDCG_10 = 0.6433224
# DCG@2 = 0/1 + 2/1.5849625 = 1.2618595; IDCG@2 = 2.6309298 (both relevant docs fit in 2 ranks)
# nDCG@2 = 1.2618595 / 2.6309298 = 0.4796249
NDCG_2 = 0.4796249


def test_ndcg_hand_computed() -> None:
    assert ndcg_at_k(RANKING, QRELS, 10) == pytest.approx(NDCG_10, abs=1e-7)
    assert ndcg_at_k(RANKING, QRELS, 2) == pytest.approx(NDCG_2, abs=1e-7)
    # rank 1 is d3 (grade 0): DCG@1 = 0
    assert ndcg_at_k(RANKING, QRELS, 1) == 0.0
    # the ideal order scores 1: DCG = 2/1 + 1/1.5849625 = IDCG
    assert ndcg_at_k(["d1", "d2"], QRELS, 10) == pytest.approx(1.0)
    # swapped: DCG = 1/1 + 2/1.5849625 = 2.2618595; / 2.6309298 = 0.8597186
    assert ndcg_at_k(["d2", "d1"], QRELS, 10) == pytest.approx(0.8597186, abs=1e-7)


def test_ndcg_ideal_is_cut_at_k() -> None:
    # three relevant docs of grade 1; k = 2 → IDCG@2 = 1/1 + 1/1.5849625 = 1.6309298
    # ranking [a, x]: DCG@2 = 1/1 = 1 → nDCG@2 = 1 / 1.6309298 = 0.6131472
    qrels = {"a": 1, "b": 1, "c": 1}
    assert ndcg_at_k(["a", "x", "b"], qrels, 2) == pytest.approx(0.6131472, abs=1e-7)


def test_recall_hand_computed() -> None:
    # relevant = {d1, d2} (d3 has grade 0)
    assert recall_at_k(RANKING, QRELS, 1) == 0.0  # [d3] → 0/2
    assert recall_at_k(RANKING, QRELS, 3) == 0.5  # [d3, d1, x] → 1/2
    assert recall_at_k(RANKING, QRELS, 4) == 1.0  # + d2 → 2/2
    assert recall_at_k(RANKING, QRELS, 100) == 1.0


def test_mrr_hand_computed() -> None:
    # first relevant doc (d1) at rank 2 → 1/2
    assert mrr_at_k(RANKING, QRELS, 10) == 0.5
    assert mrr_at_k(RANKING, QRELS, 1) == 0.0  # rank 1 is d3, non-relevant
    assert mrr_at_k(["x", "y", "d2"], QRELS, 10) == pytest.approx(1 / 3)  # any grade > 0 counts


def test_duplicates_count_once_at_first_position() -> None:
    # [d1, d1, d2] is read as [d1, d2]: the copy neither scores twice nor pushes d2 out of the top 2
    assert dedupe(["d1", "d1", "d2", "d1"]) == ["d1", "d2"]
    assert recall_at_k(["d1", "d1", "d2"], QRELS, 2) == 1.0
    assert ndcg_at_k(["d1", "d1", "d2"], QRELS, 2) == pytest.approx(1.0)
    # [x, x, d1]: d1 is at rank 2 after dedupe → MRR 1/2
    assert mrr_at_k(["x", "x", "d1"], QRELS, 10) == 0.5


def test_no_relevant_documents_is_skipped() -> None:
    for fn in (ndcg_at_k, recall_at_k, mrr_at_k):
        assert fn(["d1"], {"d1": 0}, 10) is None
        assert fn(["d1"], {}, 10) is None


def test_empty_ranking_scores_zero() -> None:
    assert ndcg_at_k([], QRELS, 10) == 0.0
    assert recall_at_k([], QRELS, 10) == 0.0
    assert mrr_at_k([], QRELS, 10) == 0.0


def test_bad_k() -> None:
    with pytest.raises(ValueError):
        ndcg_at_k(RANKING, QRELS, 0)


def test_evaluate_means_skip_unjudged_queries() -> None:
    qrels = {"q1": QRELS, "q2": {"a": 1}, "q3": {"b": 0}}  # q3 has no relevant doc: skipped
    run = {"q1": RANKING, "q3": ["b"]}  # q2 missing from the run: an empty ranking, scores 0
    out = evaluate(run, qrels, ("ndcg@10", "recall@3", "mrr@10"))
    assert out["queries"] == 2
    # nDCG@10: (0.6433224 + 0) / 2 = 0.3216612; recall@3: (0.5 + 0) / 2 = 0.25; MRR@10: (0.5 + 0) / 2
    assert out["ndcg@10"] == pytest.approx(0.3216612, abs=1e-7)
    assert out["recall@3"] == 0.25
    assert out["mrr@10"] == 0.25
    with pytest.raises(ValueError):
        evaluate(run, qrels, ("map@10",))


def test_evaluate_with_nothing_to_average() -> None:
    assert evaluate({}, {"q": {"a": 0}}, ("ndcg@10",)) == {"ndcg@10": 0.0, "queries": 0}


def test_percentile_linear_interpolation() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    # sorted [1, 2, 3, 4]; p50 at position 3 * 0.5 = 1.5 → 2 + 0.5 * (3 - 2) = 2.5
    assert percentile(values, 50) == 2.5
    # p95 at position 3 * 0.95 = 2.85 → 3 + 0.85 * (4 - 3) = 3.85
    assert percentile(values, 95) == pytest.approx(3.85)
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
