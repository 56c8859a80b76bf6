"""`kdbl-control bench scale` end to end at 1,000 and 2,000 synthetic chunks: bulk growth, the real kdbl-api
process, the exhaustive BM25 reference and its top-10 agreement with the served keyword arm, storage per
chunk and ingestion rates (issue 19's harness). One bench run serves every test of the module."""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path

import psycopg
import pytest

from kdbl_control import bench_exhaustive, bench_scale
from kdbl_core.db.connect import conninfo

# a vocabulary drawn Zipf-like, so some terms are in nearly every chunk and some in few
WORDS = ("okapi migration forest rains season aspirin fever headache patients clinic parking visitors hours "
         "protein kinase receptor binding cell tumour growth signalling pathway gene expression mouse model "
         "trial placebo dose outcome risk cohort").split()
QUERIES = ["okapi migration", "aspirin fever patients", "protein kinase signalling", "placebo dose trial"]
SIZES = [1_000, 2_000]


def _write_beir(folder: Path) -> Path:
    rng = random.Random(19)
    (folder / "qrels").mkdir(parents=True)
    weights = [1 / (rank + 1) for rank in range(len(WORDS))]
    with (folder / "corpus.jsonl").open("w") as fh:
        for n in range(60):
            text = " ".join(rng.choices(WORDS, weights=weights, k=40))
            fh.write(json.dumps({"_id": f"d{n}", "title": "", "text": text}) + "\n")
    with (folder / "queries.jsonl").open("w") as fh:
        for i, query in enumerate(QUERIES):
            fh.write(json.dumps({"_id": f"q{i}", "text": query}) + "\n")
    return folder


@pytest.fixture(scope="module")
def scale_run(owner_url, embed_model_path, tmp_path_factory):
    """One bench run at 1,000 then 2,000 chunks, in batches of 600 (so a growth step spans several)."""
    tmp = tmp_path_factory.mktemp("scale")
    tenant = f"scale-{uuid.uuid4().hex[:10]}"
    patch = pytest.MonkeyPatch()
    patch.setattr(bench_scale, "TENANT", tenant)
    patch.setattr(bench_scale, "BATCH_CHUNKS", 600)
    lines: list[str] = []
    try:
        result = bench_scale.run_scale_bench(owner_url, _write_beir(tmp / "zipf"), tmp, sizes=SIZES,
                                             model_path=embed_model_path, n_queries=len(QUERIES), clients=1,
                                             seconds=1.0, log=lines.append)
    finally:
        patch.undo()
    with psycopg.connect(conninfo(owner_url)) as conn:
        [tenant_id] = conn.execute("SELECT id FROM tenants WHERE name = %(n)s", {"n": tenant}).fetchone()
    return tenant_id, result, lines


def test_bench_scale_grows_a_synthetic_corpus_and_measures_both_modes_over_http(scale_run, owner_url):
    tenant, result, lines = scale_run
    assert [s["chunks"] for s in result["steps"]] == SIZES
    for step in result["steps"]:
        for mode in ("lexical", "hybrid"):
            assert step[mode]["n"] == len(QUERIES) and step[mode]["errors"] == 0, step[mode]["error_samples"]
    with psycopg.connect(conninfo(owner_url)) as conn:
        chunks, embedded, files = conn.execute(
            "SELECT count(*), count(embedding), count(DISTINCT file_id) FROM chunks WHERE tenant_id = %(t)s",
            {"t": tenant}).fetchone()
        # the statistics the BM25 query reads agree with the postings written in bulk
        n, total = conn.execute("SELECT sum(n_chunks), sum(total_len) FROM corpus_stats WHERE tenant_id = %(t)s",
                                {"t": tenant}).fetchone()
        [real_total] = conn.execute("SELECT sum(token_count) FROM chunks WHERE tenant_id = %(t)s",
                                    {"t": tenant}).fetchone()
        [drift] = conn.execute("""
            SELECT count(*) FROM (SELECT t.term, count(*) AS df FROM chunks c CROSS JOIN LATERAL unnest(string_to_array(c.terms, ' ')) AS t(term)
                                   WHERE c.tenant_id = %(t)s GROUP BY t.term) p
            FULL JOIN (SELECT term, sum(df) AS df FROM term_stats WHERE tenant_id = %(t)s GROUP BY term) s
            USING (term) WHERE p.df IS DISTINCT FROM s.df""", {"t": tenant}).fetchone()
    assert (chunks, embedded, files) == (2_000, 2_000, 500)
    assert n == 2_000 and total == real_total and drift == 0
    assert any("HNSW index built" in line for line in lines)


def test_the_served_keyword_arm_agrees_with_exhaustive_bm25_on_every_query(scale_run):
    _, result, _ = scale_run
    for step in result["steps"]:
        arm = step["keyword_arm"]
        # search_content's default call: a page of 20 plus one; served from the packed lists (the embedded
        # server has the kdbl_bm25 extension), the unpacked lists summed in SQL beside it
        assert arm["depth"] == 21 and arm["method"] == "native"
        for method in ("served_sql", "exhaustive_sql"):
            assert arm[method]["n"] == len(QUERIES) and 0 < arm[method]["p50_ms"] <= arm[method]["p95_ms"]
        agreement = arm["agreement"]
        assert agreement["queries"] == len(QUERIES) and agreement["mean_exact_hits"] == 10  # every query hits
        assert agreement["identical_share"] == agreement["same_set_share"] == 1.0
        assert agreement["mean_overlap_at_10"] == 1.0
        assert step["maintenance"]["lists_postings"] > 0 and step["maintenance"]["lists_build_s"] >= 0


def test_top_10_agreement_counts_identical_lists_shared_sets_and_overlap() -> None:
    exact = [list(range(1, 13)), [1, 2, 3], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], []]
    served = [list(range(1, 11)) + [99],  # identical top 10 (only the 11th differs)
              [2, 1, 3],  # same set, other order
              [5, 6, 7, 8, 9, 10, 11, 12, 40, 41],  # 8 of 10 shared
              []]  # nothing matched either way: agreement
    assert bench_exhaustive.agreement(served, exact) == {
        "k": 10, "queries": 4, "mean_exact_hits": 5.75, "identical_share": 0.5, "same_set_share": 0.75,
        "mean_overlap_at_10": round((1 + 1 + 0.8 + 1) / 4, 4)}


def test_storage_reports_bytes_per_chunk_of_every_search_table_and_index(scale_run) -> None:
    _, result, _ = scale_run
    for step in result["steps"]:
        storage = step["storage"]
        assert storage["chunks"] >= step["chunks"]  # the whole tables: other tests' tenants share them
        assert [t["table"] for t in storage["tables"]] == list(bench_scale.STORAGE_TABLES)
        for table in storage["tables"]:  # postings: the delta since a build, its heap empty right after one
            assert table["bytes_per_chunk"] > 0 and (table["heap_bytes"] > 0 or table["table"] == "postings")
            assert table["toast_and_maps_per_chunk"] >= 0
            assert table["total_bytes"] == (table["heap_bytes"] + table["index_bytes"]
                                            + table["toast_and_maps_bytes"])
        indexes = {i["index"]: i for i in storage["indexes"]}
        assert f"chunks_embedding_{result['dimensions']}_hnsw" in indexes
        assert set(bench_scale.STORAGE_TABLES) <= {i["table"] for i in indexes.values()}  # each has an index
        assert all(i["bytes"] > 0 and i["bytes_per_chunk"] > 0 for i in indexes.values())
        by_table = {t["table"]: t for t in storage["tables"]}
        assert sum(i["bytes"] for i in indexes.values() if i["table"] == "postings") == \
            by_table["postings"]["index_bytes"]
        assert storage["bytes_per_chunk"] == round(sum(t["total_bytes"] for t in storage["tables"])
                                                   / storage["chunks"], 1)


def test_each_growth_step_reports_chunks_and_postings_per_second(scale_run, owner_url) -> None:
    tenant, result, _ = scale_run
    loads = [s["load"] for s in result["steps"]]
    assert [load["chunks_added"] for load in loads] == [1_000, 1_000]
    assert all(load["writers"] == 2 for load in loads)  # two connections at once, as the worker's writers
    assert all(load["chunks_per_s"] > 0 and load["postings_per_s"] > load["chunks_per_s"] for load in loads)
    with psycopg.connect(conninfo(owner_url)) as conn:
        [postings] = conn.execute("SELECT sum(cardinality(tfs)) FROM chunks WHERE tenant_id = %(t)s",
                                  {"t": tenant}).fetchone()
        [rows] = conn.execute("SELECT count(*) FROM postings WHERE tenant_id = %(t)s", {"t": tenant}).fetchone()
    assert sum(load["postings_added"] for load in loads) == postings and rows == 0  # all packed, rows deleted


def test_the_summary_prints_issue_19s_table_ingestion_and_storage(scale_run) -> None:
    _, result, _ = scale_run
    text = bench_scale.summarise(result)
    assert ("| chunks | lexical p50 / p95 ms (served) | keyword SQL served (method) "
            "| exhaustive p50 / p95 ms | top-10 identical / overlap@10 | hybrid p50 / p95 ms | database MB |") in text
    rows = [line for line in text.splitlines() if line.startswith(("| 1,000 |", "| 2,000 |"))]
    assert len(rows) == 2 and all("| 100.0% / 1.000 |" in row and "(native)" in row for row in rows)
    assert "postings/s" in text and "bytes per chunk" in text and "lists build s" in text
    storage = text[text.index("bytes per chunk"):].splitlines()
    assert storage[1].split() == ["1,000", "2,000"]
    postings = next(line for line in storage if line.startswith("postings "))
    assert len(postings.split()) == 3  # the table's name, then bytes per chunk at each size


def test_a_lexical_only_run_writes_no_vectors_and_measures_lexical_alone(owner_url, embed_model_path,
                                                                          tmp_path) -> None:
    tenant = f"scale-lex-{uuid.uuid4().hex[:10]}"
    patch = pytest.MonkeyPatch()
    patch.setattr(bench_scale, "TENANT", tenant)
    lines: list[str] = []
    try:
        result = bench_scale.run_scale_bench(owner_url, _write_beir(tmp_path / "zipf"), tmp_path, sizes=[500],
                                             model_path=embed_model_path, n_queries=len(QUERIES), clients=1,
                                             seconds=1.0, log=lines.append, lexical_only=True, writers=1,
                                             exhaustive_queries=2, build_lists=False)
    finally:
        patch.undo()
    [step] = result["steps"]
    assert result["dimensions"] == 0 and "hybrid" not in step and step["lexical"]["errors"] == 0
    arm = step["keyword_arm"]  # the exhaustive reference sampled: the first two queries, the served arm on all
    assert arm["exhaustive_queries"] == 2 and arm["exhaustive_sql"]["n"] == 2
    assert arm["served_sql"]["n"] == len(QUERIES) and arm["agreement"]["queries"] == 2
    assert arm["agreement"]["identical_share"] == 1.0 and step["load"]["writers"] == 1
    assert not any("HNSW index built" in line for line in lines)
    # searched over the writers' own generations (no full build): the same top 10 as the reference
    assert any("as the writers packed them" in line for line in lines)
    assert step["maintenance"]["lists_build_s"] is None
    with psycopg.connect(conninfo(owner_url)) as conn:
        [vectors] = conn.execute("SELECT count(embedding) FROM chunks c JOIN tenants t ON t.id = c.tenant_id "
                                 "WHERE t.name = %(n)s", {"n": tenant}).fetchone()
    assert vectors == 0
    text = bench_scale.summarise(result)
    assert "no vectors (lexical only)" in text and "| 500 |" in text and " | - | " in text
    assert "| 100.0% / 1.000 (2 sampled) |" in text
