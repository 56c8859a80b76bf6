"""Per-chunk token counts (chunks.text_tokens): the model's tokenizer (a vocab-only load) counts what the
embedder counts; without a model, or with one that cannot load, a deterministic estimate stands in."""

from __future__ import annotations

import logging

from kdbl_core.embedder import Tokenizer
from kdbl_core.settings import Settings
from kdbl_worker import bench_tokens, token_counts
from kdbl_worker.pipeline import chunk_rows

TEXTS = [
    "",
    "Hello, world!",
    "Heliostats track the sun's azimuth; the receiver's molten-salt loop runs at 565 °C (1,049 °F).",
    "Ünïcödé tëxt, 漢字のテスト and an emoji 🙂 beside CamelCaseIdentifiers_with_underscores.",
    "word " * 3000,  # longer than any buffer the tokenizer starts with
]


def test_the_tokenizer_counts_what_the_embedding_model_counts(embed_model_path, embedder):
    tokenizer = Tokenizer(embed_model_path)
    try:
        assert [tokenizer.count(t) for t in TEXTS] == [embedder.count_tokens(t) for t in TEXTS]
        assert tokenizer.count("word " * 3000) == 3000
    finally:
        tokenizer.close()


def test_the_estimate_is_deterministic_and_near_the_tokenizer_on_prose(embedder):
    prose = ("Mirrors in the heliostat field follow the sun from dawn to dusk, and operators calibrate each "
             "one against a reference target every season. Photovoltaic modules degrade by roughly half a "
             "percent per year, so maintenance schedules account for gradual performance loss. ") * 5
    assert token_counts.estimate(prose) == token_counts.estimate(prose)
    real = embedder.count_tokens(prose)
    assert abs(token_counts.estimate(prose) - real) <= 0.15 * real
    assert token_counts.estimate("") == 0 and token_counts.estimate("漢字") == 2


def test_without_a_model_the_worker_counts_with_the_estimate():
    assert token_counts.counter(Settings()) is token_counts.estimate


def test_with_a_model_the_worker_counts_with_its_tokenizer(embed_model_path, embedder):
    count = token_counts.counter(Settings(embed_model_path=str(embed_model_path)))
    assert count is not token_counts.estimate
    assert [count(t) for t in TEXTS] == [embedder.count_tokens(t) for t in TEXTS]


def test_a_model_that_cannot_load_falls_back_to_the_estimate_and_says_so(tmp_path, caplog):
    missing = tmp_path / "absent.gguf"
    with caplog.at_level(logging.WARNING, logger="kdbl_worker.token_counts"):
        count = token_counts.counter(Settings(embed_model_path=str(missing)))
    assert count is token_counts.estimate
    [record] = [r for r in caplog.records if r.name == "kdbl_worker.token_counts"]
    assert record.getMessage() == "tokenizer unavailable; token counts are estimates"
    assert record.model_path == str(missing)


def test_the_sandbox_chunk_tuples_become_rows_with_their_token_counts():
    rows = chunk_rows([(0, "alpha beta", 0, 10, None, None, None, "Guide"),
                       (1, "gamma", 12, 17, 2, None, None, None)], token_counts.estimate)
    assert [(r.seq, r.context_header, r.text_tokens, r.page_no) for r in rows] == [
        (0, "Guide", 2, None), (1, None, 1, 2)]


def test_the_bench_reports_the_estimates_error_and_each_counters_cost(tmp_path, embed_model_path):
    lines = [f'{{"_id": "{n}", "title": "Doc {n}", "text": "Heliostat number {n} tracks the sun."}}' for n in range(20)]
    (tmp_path / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    report = bench_tokens.measure(tmp_path, embed_model_path)
    assert (report["files"], report["chunks"]) == (20, 20)
    assert 0 <= report["estimate_mean_abs_error"] < 0.5 and report["tokenizer_s_per_mb"] > 0
