"""`kdbl-control bench vectors` on a 2,000-chunk bench-scale tenant built here (bench_scale.grow + maintain):
the served index's facts, recall against the exact reference, restricted principals under RLS (rolled back)
and the quantised indexes, which are gone afterwards. One bench run serves most tests of the module."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from helpers import write_beir
from kdbl_control import admin, bench_scale, bench_vectors
from kdbl_core.access.principal import Principal
from kdbl_core.db.connect import conninfo, sync_pool
from kdbl_core.embedder import Embedder

CHUNKS = 2_000
QUERIES = {"q0": "aspirin lowers fever", "q1": "protein kinase signalling", "q2": "placebo controlled trial"}
WORDS = "aspirin fever protein kinase receptor tumour placebo dose cohort trial gene mouse".split()


def _quantised_left(owner_url: str, dim: int) -> list[str]:
    names = [name for name, _, _ in bench_vectors.quantised_indexes(dim).values()]
    with psycopg.connect(conninfo(owner_url)) as conn:
        rows = conn.execute("SELECT relname FROM pg_class WHERE relname = ANY(%(n)s)", {"n": names})
        return [r[0] for r in rows]


@pytest.fixture(scope="module")
def lab(owner_url, embed_model_path, tmp_path_factory):
    """A bench-scale tenant of 2,000 synthetic chunks with its HNSW index, as `bench scale` leaves one."""
    tmp = tmp_path_factory.mktemp("vectors")
    tenant = f"vectors-{uuid.uuid4().hex[:10]}"
    with Embedder(embed_model_path, n_threads=1) as embedder:
        dim, model_id = embedder.dim, embedder.model_id
    with sync_pool(owner_url, size=1) as owner:
        t = admin.create_tenant(owner, tenant)
        source = admin.add_source(owner, tenant, protocol="fs", config={"root": str(tmp)}, name="synthetic")
    cumulative = list(range(1, len(WORDS) + 1))
    bench_scale.grow(owner_url, t.id, source.id, CHUNKS, dim=dim, model_id=model_id, words=WORDS,
                     cumulative=cumulative, log=lambda _: None)
    bench_scale.maintain(owner_url, dim, lambda _: None)
    dataset = write_beir(tmp / "beir", {"d0": ("", "aspirin")}, QUERIES)
    return {"tenant": tenant, "tenant_id": t.id, "source_id": source.id, "dim": dim, "model_id": model_id,
            "dataset": dataset}


@pytest.fixture(scope="module")
def run(lab, owner_url, embed_model_path):
    patch = pytest.MonkeyPatch()
    patch.setattr(bench_vectors, "EF_SEARCH", (40, 1000))  # 1,000: pgvector's largest
    lines: list[str] = []
    try:
        result = bench_vectors.run_vectors_bench(owner_url, lab["dataset"], model_path=embed_model_path,
                                                 tenant=lab["tenant"], n_queries=len(QUERIES), n_random=4,
                                                 log=lines.append)
    finally:
        patch.undo()
    return result, lines


def test_the_served_index_is_reported_with_its_size_and_pgvectors_default_build_parameters(run, lab):
    result, lines = run
    index = result["served_index"]
    assert index["name"] == f"chunks_embedding_{lab['dim']}_hnsw"
    assert index["bytes"] > 0 and index["indexed_vectors"] >= CHUNKS
    assert index["bytes_per_vector"] == round(index["bytes"] / index["indexed_vectors"], 1)
    assert (index["m"], index["ef_construction"]) == (16, 64)
    assert result["vectors"] == CHUNKS and result["query_vectors"] == {"dataset": len(QUERIES), "random": 4}
    assert result["pgvector"].startswith("0.") and result["iterative_scan_supported"]
    assert "random unit vectors" in result["corpus"]
    assert any(line.startswith("vectors: exact") for line in lines)


def test_recall_is_a_share_and_the_exact_reference_reads_no_hnsw_index(run, lab):
    result, _ = run
    for kind, exact in result["exact"].items():
        assert not any(name.endswith("_hnsw") for name in exact["plan_indexes"]), kind
        assert exact["k"] == 100 and 0 < exact["p50_ms"] <= exact["p95_ms"]
    sweep = result["ef_search_sweep"]
    assert {(r["queries"], r["k"], r["ef_search"]) for r in sweep} == {
        (kind, k, ef) for kind in ("dataset", "random") for k in (10, 100) for ef in (40, 1000)}
    for row in sweep:
        assert 0.0 <= row["min_recall"] <= row["recall"] <= 1.0
        assert row["mean_returned"] == row["k"]  # relaxed_order iterates past ef_search: always k rows
    # on 2,000 vectors, ef_search 1,000 reaches the exact neighbours, all but the odd one: HNSW promises no
    # more (a node the graph cannot reach, or an exact tie at the k-th place in half precision; a full
    # suite run of 2026-11-28 saw recall below 1.0 once in six runs)
    assert all(r["recall"] >= 0.99 for r in sweep if r["ef_search"] == 1000)
    assert [r["ef_search"] for r in sweep if r["served"]] == []  # 200, the served value, is not in this sweep


def test_restricted_principals_see_only_their_granted_files_and_iterative_scans_fill_k(run, lab, owner_url):
    result, _ = run
    rows = result["restricted"]
    assert {(r["share"], r["iterative_scan"]) for r in rows} == {
        (share, mode) for share in (0.01, 0.10) for mode in ("relaxed_order", "off")}
    for row in rows:
        assert row["outside_grants"] == 0  # nothing outside the principal's grants comes back
        assert row["visible_vectors"] == round(CHUNKS * row["share"])  # every n-th file, 4 chunks each
        assert 0.0 <= row["recall"] <= 1.0
        assert not any(name.endswith("_hnsw") for name in row["exact"]["plan_indexes"])
        if row["iterative_scan"] == "relaxed_order":
            assert row["mean_returned"] == min(row["k"], row["visible_vectors"]) and row["short_share"] == 0
    # with iterative scans off the index stops after ef_search candidates: 1% of 2,000 leaves fewer than k
    off = [r for r in rows if r["iterative_scan"] == "off" and r["share"] == 0.01]
    assert all(r["mean_returned"] < min(r["k"], r["visible_vectors"]) for r in off)
    with psycopg.connect(conninfo(owner_url)) as conn:  # the grants and the ACL change were rolled back
        [grants] = conn.execute("SELECT count(*) FROM grants WHERE tenant_id = %(t)s",
                                {"t": lab["tenant_id"]}).fetchone()
        [acl] = conn.execute("SELECT acl_mode FROM sources WHERE id = %(s)s",
                             {"s": lab["source_id"]}).fetchone()
    assert (grants, acl) == (0, "tenant")


def test_quantised_indexes_are_measured_against_exact_and_dropped_afterwards(run, lab, owner_url):
    result, _ = run
    rows = result["quantisation"]
    assert {(r["method"], r["candidates"]) for r in rows} == {
        (method, n) for method in ("binary", "halfvec") for n in (10, 40, 100, 200)}
    for row in rows:
        assert row["bytes"] > 0 and row["k"] == 10
        assert (row["build_s"] is None) == (row["method"] == "halfvec")  # the served index is not rebuilt
        assert 0.0 <= row["recall"] <= 1.0 and row["keeps_0_98_of_exact"] == (row["recall"] >= 0.98)
    assert _quantised_left(owner_url, lab["dim"]) == []


def test_a_failing_quantisation_run_still_drops_the_indexes_it_built(lab, owner_url):
    principal = Principal(tenant_id=lab["tenant_id"], tenant_name=lab["tenant"], subject="user:bench")
    vectors = {"random": bench_vectors.random_unit_vectors(1, lab["dim"])}
    with pytest.raises(ValueError):  # a query vector without its exact ranking: fails after the first build
        bench_vectors.quantisation(owner_url, principal, vectors, {"random": []}, lab["model_id"], lab["dim"],
                                   {"name": f"chunks_embedding_{lab['dim']}_hnsw", "bytes": 1,
                                    "indexed_vectors": CHUNKS}, log=lambda _: None)
    assert _quantised_left(owner_url, lab["dim"]) == []


def test_the_summary_prints_the_sweep_the_restricted_principals_and_quantisation(run):
    result, _ = run
    text = bench_vectors.summarise(result)
    assert "served index chunks_embedding_" in text and "random unit vectors" in text
    assert "| queries | k | ef_search | recall@k | min | p50 / p95 ms |" in text
    assert "| 1% | 20 | dataset | 100 | off |" in text
    assert "| binary | random | 200 |" in text


def test_recall_counts_the_exact_top_k_found_and_is_whole_when_nothing_matches():
    assert bench_vectors.recall([1, 2, 3, 9], [1, 2, 3, 4], 4) == 0.75
    assert bench_vectors.recall([4, 3, 2, 1, 7], [1, 2, 3, 4, 5], 4) == 1.0  # order within the top k aside
    assert bench_vectors.recall([1], [1, 2], 10) == 0.5  # fewer exact hits than k: a share of those
    assert bench_vectors.recall([], [], 10) == 1.0
    assert [bench_vectors.served_ef(k) for k in (10, 100, 800)] == [64, 200, 1000]
