"""`kdbl-control bench search --response-modes` end to end on a tiny folder: real crawl, real kdbl-api
process, each response mode's latency, bytes and tokens per 10 hits by the embedding model's tokenizer."""

from __future__ import annotations

from kdbl_control.bench_modes import heading_queries, run_modes_bench, summarise

FILES = {
    "a.md": "# Okapi migration\n\nThe okapi migration season starts when the rains come to the forest.\n",
    "b.md": "# Aspirin and fever\n\nAspirin reduces fever and headache in most adult patients.\n\n## x\n",
    "c.txt": "Clinic opening hours and parking information for visitors: okapi fever parking.",
}


def test_bench_response_modes_reports_each_modes_latency_bytes_and_tokens(owner_url, tmp_path, unique,
                                                                          embed_model_path):
    folder = tmp_path / f"modes-{unique}"
    folder.mkdir()
    for name, body in FILES.items():
        (folder / name).write_text(body)
    assert heading_queries(folder, 10) == ["Okapi migration", "Aspirin and fever"]  # "x" is too short
    result = run_modes_bench(owner_url, folder, tmp_path / "work", n_queries=10, model_path=embed_model_path)
    assert result["queries"] == 2 and result["chunks"] == 3
    modes = {m["response_mode"]: m for m in result["modes"]}
    assert list(modes) == ["(default)", "ids_only", "metadata", "preview", "full"]
    assert all(m["p50_ms"] > 0 and m["hits_per_call"] >= 1 for m in modes.values())
    tokens = [modes[m]["tokens_per_10_hits"] for m in ("ids_only", "metadata", "preview", "full")]
    assert tokens == sorted(tokens) and tokens[0] * 3 < tokens[-1]
    assert modes["ids_only"]["bytes_per_call"] < modes["metadata"]["bytes_per_call"] < modes["full"]["bytes_per_call"]
    assert "tokens/10 hits" in summarise(result)
