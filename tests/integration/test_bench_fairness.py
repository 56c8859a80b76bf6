"""`kdbl-control bench fairness` on a tiny BEIR folder: two real tenants crawled, a real kdbl-api process, the
quiet tenant measured alone and beside the noisy one's heavy calls. Only the shape of the result is
checked (the numbers are the lead's, at scale: docs/benchmarks.md)."""

from __future__ import annotations

from helpers import write_beir

from kdbl_control.bench_fairness import long_queries, run_fairness_bench, summarise

DOCS = {f"d{i}": (f"Topic {i}", f"Okapi migration {i} starts when the rains come to forest number {i}.")
        for i in range(6)}
QUERIES = ["okapi migration rains", "forest rains come", "migration starts when", "okapi forest"]


def test_long_queries_join_the_data_sets_queries_up_to_the_length_asked():
    made = long_queries(["alpha beta", "gamma"], 3, chars=25)
    assert made == ["alpha beta gamma alpha be", "gamma alpha beta gamma al", "alpha beta gamma alpha be"]
    assert all(len(q) <= 25 for q in made)


def test_the_fairness_bench_measures_the_quiet_tenant_alone_and_beside_a_noisy_one(owner_url, tmp_path, unique):
    folder = write_beir(tmp_path / "tiny", DOCS, {f"q{i}": q for i, q in enumerate(QUERIES)})
    result = run_fairness_bench(owner_url, folder, tmp_path / "work", seconds=1.0, noisy_clients=2, n_queries=4,
                                noisy_max_in_flight=2, quiet_tenant=f"quiet-{unique}", noisy_tenant=f"noisy-{unique}")
    alone, beside, noisy = result["alone"], result["with_noisy_neighbour"], result["noisy"]
    assert alone["answered"] > 0 and alone["errors"] == 0 and alone["refused_429"] == 0
    assert beside["answered"] > 0 and beside["errors"] == 0 and beside["refused_429"] == 0
    assert noisy["answered"] > 0 and noisy["errors"] == 0, noisy["error_samples"]
    assert result["p95_ratio"] > 0 and result["noisy_max_in_flight"] == 2
    assert "p95 ratio" in summarise(result)
