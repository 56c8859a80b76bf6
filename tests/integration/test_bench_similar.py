"""`kdbl-control bench similar` on a tiny BEIR folder with multi-document judgements: real crawl, real
embeddings, a real kdbl-api process; find_similar's recall@10 per method beside the exact dense reference."""

from __future__ import annotations

from helpers import write_beir

from kdbl_control.bench_similar import _recall, claims, run_similar_bench, summarise

TOPICS = {"volcano": "Magma and lava erupt from the volcano; ash covers the valley after the eruption.",
          "bread": "Yeast makes the bread dough rise before the loaf is baked in the oven.",
          "sail": "The sailboat trims its mainsail and jib as the wind shifts on the bay."}
FILLER = ["Quarterly tax forms are due at the municipal office.", "The violin quartet rehearsed a Haydn piece.",
          "Granite countertops resist heat and scratches.", "The marathon route closes the bridge at noon.",
          "Chess openings reward control of the centre.", "A firmware update fixed the router's memory leak.",
          "Tulip bulbs are planted in autumn before the frost.", "The museum lent its tapestry to a gallery.",
          "Solar panels on the depot roof feed the chargers.", "Owls hunt voles in the stubble at dusk.",
          "The courier lost the parcel between two depots.", "Glaciers carve U-shaped valleys over millennia."]
DOCS = {f"{topic}{i}": (f"{topic} note {i}", f"{text} Observation {i}.") for topic, text in TOPICS.items()
        for i in range(3)} | {f"filler{i}": (f"note {i}", text) for i, text in enumerate(FILLER)}
QRELS = [("q1", "volcano0"), ("q1", "volcano1"), ("q1", "volcano2"), ("q2", "bread0"), ("q2", "bread1"),
         ("q3", "sail0")]


def test_recall_counts_the_other_cited_documents_in_the_top_ten():
    assert _recall(["b", "x", "c"], "a", ["a", "b", "c", "d"]) == (2 / 3, True)
    assert _recall(["x"], "a", ["a", "b"]) == (0.0, False)


def test_the_similar_bench_measures_both_methods_and_the_exact_reference(owner_url, tmp_path, unique, monkeypatch,
                                                                          embed_model_path):
    folder = write_beir(tmp_path / "tiny", DOCS, {q: q for q in ("q1", "q2", "q3")}, QRELS)
    assert claims(folder, "train") == [["volcano0", "volcano1", "volcano2"], ["bread0", "bread1"]]
    monkeypatch.setattr("kdbl_control.bench_similar.TENANT", f"bench-{unique}")
    result = run_similar_bench(owner_url, folder, tmp_path / "work", embed_model_path, terms=(25, 8))
    for method in ("vector", "lexical", "exact_dense_file_means"):
        assert result[method]["subjects"] == 5
        assert result[method]["recall_at_10"] == 1.0  # 21 documents: random would find ~half
    assert set(result["lexical_by_terms"]) == {25, 8} and result["lexical"] == result["lexical_by_terms"][25]
    assert result["random_recall_at_10"] == 0.5
    assert result["vector"]["p50_ms"] > 0 and "recall@10" in summarise(result)
