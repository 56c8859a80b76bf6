"""`kdbl-control bench answer` on a tiny BEIR folder: the slice it indexes, a real kdbl-api process with the
tests' tiny chat model, extractive latency and found counts, abstractive tokens/s."""

from __future__ import annotations

from chat_model import build_chat_model
from helpers import write_beir

from kdbl_control.bench_answer import run_answer_bench, slice_corpus, summarise

DOCS = {f"d{i}": (f"Okapi {i}", f"Okapi migration number {i} starts when the rains come to the forest.")
        for i in range(6)}
CLAIMS = {"q0": ("okapi migration rains forest", "d1"), "q1": ("when do okapis migrate with the rains", "d2"),
          "q2": ("zebrafin payroll encryption", "d3")}


def _beir(folder):
    return write_beir(folder, DOCS, {qid: text for qid, (text, _) in CLAIMS.items()},
                      [(qid, doc) for qid, (_, doc) in CLAIMS.items()])


def test_the_slice_holds_the_judged_abstracts_and_n_others(tmp_path):
    pairs = slice_corpus(_beir(tmp_path / "beir"), tmp_path / "docs", n_queries=2, n_docs=1, split="train")
    assert pairs == [("okapi migration rains forest", {"d1"}), ("when do okapis migrate with the rains", {"d2"})]
    assert sorted(p.name for p in (tmp_path / "docs").iterdir()) == ["d0.txt", "d1.txt", "d2.txt"]


def test_the_answer_bench_measures_extractive_latency_and_abstractive_tokens_per_second(owner_url, tmp_path,
                                                                                         unique, monkeypatch):
    monkeypatch.setattr("kdbl_control.bench_answer.TENANT", f"bench-{unique}")
    model = build_chat_model(tmp_path / "tiny-chat.gguf")
    result = run_answer_bench(owner_url, _beir(tmp_path / "beir"), tmp_path / "work", n_queries=3, n_docs=6,
                              chat_model=model, max_tokens=16)
    extractive = result["extractive"]
    assert result["questions"] == 3 and extractive["found"] == 2 and extractive["p50_ms"] > 0
    assert extractive["server_p50_ms"]["sentences"] > 0
    abstractive = result["abstractive"]
    assert abstractive["generated"] == 2 and abstractive["finish_reasons"] == ["length", "length"]
    assert abstractive["tokens_per_s_p50"] > 0 and abstractive["decode_tokens_per_s_p50"] > 0
    assert "extractive: p50" in summarise(result)
