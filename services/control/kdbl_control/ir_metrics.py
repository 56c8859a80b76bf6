"""Retrieval quality metrics, as BEIR reports them (pytrec_eval / trec_eval conventions).

Per query, ``ranking`` is a list of document ids, best first, and ``qrels`` maps document ids to graded
relevance (``grade > 0`` is relevant; 0 or negative grades are judged non-relevant). Conventions:

- nDCG@k: DCG = sum over ranks i = 1..k of ``grade_i / log2(i + 1)`` (linear gain, as trec_eval's
  ``ndcg_cut``); the ideal DCG is that of the query's own positive grades sorted descending, cut at k.
- recall@k: relevant documents in the top k divided by all relevant documents of the query.
- MRR@k: ``1 / rank`` of the first relevant document within the top k, else 0.
- A query without any relevant document is skipped (the per-query functions return ``None`` and
  :func:`evaluate` leaves it out of the means), as BEIR does.
- A document listed twice in a ranking counts once, at its first position (later copies are dropped
  before cutting at k, so they do not push other documents out).
- A query with relevant documents but no (or an empty) ranking scores 0 on every metric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence


def dedupe(ranking: Iterable[str]) -> list[str]:
    """The ranking with repeated ids removed, first occurrence kept."""
    seen: set[str] = set()
    out = []
    for doc in ranking:
        if doc not in seen:
            seen.add(doc)
            out.append(doc)
    return out


def _relevant(qrels: Mapping[str, int]) -> dict[str, int]:
    return {doc: grade for doc, grade in qrels.items() if grade > 0}


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


def ndcg_at_k(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float | None:
    _check_k(k)
    relevant = _relevant(qrels)
    if not relevant:
        return None
    dcg = sum(relevant.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(dedupe(ranking)[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(grade / math.log2(i + 2) for i, grade in enumerate(ideal))
    return dcg / idcg


def recall_at_k(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float | None:
    _check_k(k)
    relevant = _relevant(qrels)
    if not relevant:
        return None
    return sum(1 for doc in dedupe(ranking)[:k] if doc in relevant) / len(relevant)


def mrr_at_k(ranking: Sequence[str], qrels: Mapping[str, int], k: int) -> float | None:
    _check_k(k)
    relevant = _relevant(qrels)
    if not relevant:
        return None
    for i, doc in enumerate(dedupe(ranking)[:k]):
        if doc in relevant:
            return 1.0 / (i + 1)
    return 0.0


METRICS = {"ndcg": ndcg_at_k, "recall": recall_at_k, "mrr": mrr_at_k}


def evaluate(run: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]],
             measures: Sequence[str] = ("ndcg@10", "recall@10", "recall@100", "mrr@10")) -> dict[str, float]:
    """Means over the queries of ``qrels`` that have a relevant document; a query missing from ``run``
    counts as an empty ranking. Returns ``{measure: mean}`` plus ``"queries"`` (how many were averaged)."""
    parsed = []
    for measure in measures:
        name, _, cut = measure.partition("@")
        if name not in METRICS or not cut.isdigit():
            raise ValueError(f"unknown measure {measure!r} (use ndcg@K, recall@K or mrr@K)")
        parsed.append((measure, METRICS[name], int(cut)))
    sums = dict.fromkeys(measures, 0.0)
    counted = 0
    for qid, judged in qrels.items():
        if not _relevant(judged):
            continue
        counted += 1
        ranking = run.get(qid, ())
        for measure, fn, k in parsed:
            sums[measure] += fn(ranking, judged, k)
    out: dict[str, float] = {m: (sums[m] / counted if counted else 0.0) for m in measures}
    out["queries"] = counted
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= p <= 100:
        raise ValueError(f"p must lie in [0, 100], got {p}")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
