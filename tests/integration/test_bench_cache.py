"""`kdbl-control bench search --cache` on a tiny BEIR folder: real crawl, a real kdbl-api process, the
cache's misses, hits and a replayed agent session counted from each answer's meta.cache_hit."""

from __future__ import annotations

import json

import pytest
from helpers import write_beir

from kdbl_control.bench_cache import distinctive, run_cache_bench, session

DOCS = {f"d{i}": (f"Topic {i}", f"Okapi migration {i} starts when the rains come to forest number {i}.")
        for i in range(6)}
QUERIES = ["okapi migration rains", "forest rains come", "migration starts when",
           "okapi forest", "rains okapi migration forest number", "topic okapi"]


def test_distinctive_keeps_the_four_longest_words_in_their_order():
    assert distinctive("does aspirin reduce fever in adult patients") == "aspirin reduce fever patients"  # ties: the first
    assert distinctive("?!") == "?!"


def test_an_agent_session_asks_each_query_then_two_repeats_of_earlier_calls():
    calls = session(["alpha beta", "gamma delta"])
    assert calls == ["alpha beta", "alpha beta", "alpha beta", "alpha beta",
                     "gamma delta", "gamma delta", "alpha beta", "gamma delta"]


def test_the_cache_bench_measures_misses_hits_and_the_sessions_hit_rate(owner_url, tmp_path, unique, monkeypatch):
    folder = write_beir(tmp_path / "tiny", DOCS, {f"q{i}": query for i, query in enumerate(QUERIES)})
    monkeypatch.setattr("kdbl_control.bench_cache.TENANT", f"bench-{unique}")
    result = run_cache_bench(owner_url, folder, tmp_path / "work", n_queries=3)
    assert result["miss"]["n"] == 3 and result["miss"]["cache_hits"] == 0
    assert result["hit"]["cache_hits"] == 3 and result["hit"]["p50_ms"] > 0
    agent = result["agent_session"]
    assert agent["calls"] == 12 and agent["cache_hits"] == agent["repeats"] > 0


def test_a_data_set_without_queries_for_the_agent_session_is_refused_before_indexing(tmp_path):
    from kdbl_core.errors import ConfigError

    folder = tmp_path / "few"
    folder.mkdir()
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n"
                                                  for i, q in enumerate(QUERIES[:4])))
    with pytest.raises(ConfigError, match="pass --queries 2 or fewer"):
        run_cache_bench("postgresql://unused@127.0.0.1:1/x", folder, tmp_path / "work", n_queries=4)
    assert not (tmp_path / "work").exists()  # nothing indexed
