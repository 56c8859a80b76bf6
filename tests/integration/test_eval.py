"""`kdbl-control eval` end to end on a tiny BEIR folder: real crawl, real Postgres, search_content's handler.

The corpus is built so that every ranking is forced: each query is one rare word, found only in the
documents listed below, so the expected metrics can be computed by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdbl_control.evaluate import run_eval, summarise

CORPUS = [
    # "zebrafish" 3 times here, once in d2 (similar lengths): BM25 ranks d1 above d2
    {"_id": "d1", "title": "Zebrafish heart regeneration",
     "text": "Zebrafish regrow heart muscle; zebrafish cardiomyocytes divide after injury."},
    {"_id": "d2", "title": "Fin regrowth", "text": "Zebrafish fins grow back within weeks after amputation."},
    {"_id": "d3", "title": "Axolotl limbs", "text": "The axolotl regenerates entire limbs and organs."},
    {"_id": "d4", "title": "Salamander tails", "text": "Salamanders regrow tails and spinal cord tissue."},
    {"_id": "d5", "title": "Platypus venom", "text": "Male platypus spurs deliver venom in breeding season."},
    {"_id": "d6", "title": "Monotreme biology", "text": "Echidnas lay eggs and feed their young with milk."},
    {"_id": "d7", "title": "Mouse hearts", "text": "Adult mouse hearts scar rather than regenerate."},
    {"_id": "d8", "title": "Starfish arms", "text": "Starfish can regrow lost arms from a central disc."},
]
QUERIES = [
    {"_id": "q1", "text": "zebrafish"},   # retrieves d1, d2; judged: d2 = 1
    {"_id": "q2", "text": "axolotl"},     # retrieves d3;     judged: d3 = 2, d4 = 1 (d4 lacks the word)
    {"_id": "q3", "text": "platypus"},    # retrieves d5;     judged: d6 = 1 (lacks the word)
    {"_id": "q4", "text": "starfish"},    # judged: d8 = 0 only → no relevant doc, skipped
    {"_id": "q5", "text": "mouse"},       # no judgement at all → not run
]
QRELS = [("q1", "d2", 1), ("q2", "d3", 2), ("q2", "d4", 1), ("q3", "d6", 1), ("q4", "d8", 0)]

# Per query (ranks start at 1; log2(2) = 1, log2(3) = 1.5849625):
#   q1 [d1, d2]: DCG = 1/log2(3) = 0.6309298, IDCG = 1/1 = 1     → nDCG 0.6309298; recall 1/1; RR 1/2
#   q2 [d3]:     DCG = 2/1 = 2, IDCG = 2/1 + 1/log2(3) = 2.6309298 → nDCG 0.7601875; recall 1/2; RR 1
#   q3 [d5]:     nothing relevant retrieved                        → nDCG 0;         recall 0;   RR 0
# Means over the 3 judged queries:
#   nDCG@10 = (0.6309298 + 0.7601875 + 0) / 3 = 0.4637058
#   recall@10 = recall@100 = (1 + 0.5 + 0) / 3 = 0.5
#   MRR@10 = (0.5 + 1 + 0) / 3 = 0.5
EXPECTED = {"ndcg@10": 0.4637058, "recall@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5}


def _beir(folder: Path) -> Path:
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in CORPUS))
    (folder / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in QUERIES))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in QRELS))
    return folder


def _assert_expected(scores: dict) -> None:
    for measure, value in EXPECTED.items():
        assert scores[measure] == pytest.approx(value, abs=1e-4), measure


def test_eval_lexical_end_to_end(owner_url: str, tmp_path: Path, unique: str) -> None:
    dataset = _beir(tmp_path / "tiny")
    result = run_eval(owner_url, dataset, split="test", modes=("lexical", "semantic"), model_path=None,
                      work_dir=tmp_path / "work", tenant=f"eval-{unique}", log=lambda _: None)
    assert (result["split"], result["queries"], result["documents"]) == ("test", 3, 8)
    assert result["chunks"] == result["documents_with_chunks"] == 8  # one short document, one chunk

    lexical = result["modes"]["lexical"]
    _assert_expected(lexical)
    assert set(lexical["latency_ms"]) == {"p50", "p95"}
    assert 0 < lexical["latency_ms"]["p50"] <= lexical["latency_ms"]["p95"]
    assert "served_as" not in lexical and "errors" not in lexical
    # q1 ranks 2 documents, q2 and q3 one each
    assert lexical["docs_per_query"] == pytest.approx(round(4 / 3, 1))

    assert "unavailable" in result["modes"]["semantic"]  # no model given: reported, not crashed
    assert "unavailable" in result["references"]["dense_exact"]

    bm25s = result["references"]["bm25s"]
    assert "unavailable" not in bm25s, bm25s  # bm25s + PyStemmer must be installed
    _assert_expected(bm25s)  # same forced rankings (documents sharing no query term are not retrieved)
    assert "stemmer" in bm25s["config"]

    json.dumps(result)  # JSON-able as it is
    table = summarise(result)
    assert "lexical" in table and "ref: bm25s" in table

    # a second run over the same database reuses the tenant and its index
    again = run_eval(owner_url, dataset, split="test", modes=("lexical",), model_path=None,
                     work_dir=tmp_path / "work", tenant=f"eval-{unique}", max_queries=1, references=False,
                     log=lambda _: None)
    assert again["queries"] == 1 and again["chunks"] == 8
    # q1 alone: nDCG 0.6309298, recall 1, RR 0.5
    assert again["modes"]["lexical"]["ndcg@10"] == pytest.approx(0.6309298, abs=1e-4)
    assert again["modes"]["lexical"]["mrr@10"] == 0.5


def test_eval_semantic_and_hybrid_modes(owner_url: str, tmp_path: Path, unique: str,
                                      embed_model_path: Path) -> None:
    model = embed_model_path
    dataset = _beir(tmp_path / "tiny")
    result = run_eval(owner_url, dataset, split="test", modes=("lexical", "semantic", "hybrid"),
                      model_path=model, work_dir=tmp_path / "work", tenant=f"eval-{unique}",
                      log=lambda _: None)
    assert result["settings"]["embedding"]["embedded"] == 8
    _assert_expected(result["modes"]["lexical"])
    systems = {**result["modes"], **result["references"]}
    for name in ("semantic", "hybrid", "dense_exact", "bm25s"):
        scores = systems[name]
        assert "unavailable" not in scores, (name, scores)
        assert "served_as" not in scores, (name, scores)  # really ran as asked, not degraded
        for measure in EXPECTED:
            assert 0.0 <= scores[measure] <= 1.0, (name, measure)
        assert scores["latency_ms"]["p50"] > 0
