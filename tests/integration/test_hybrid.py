"""Hybrid retrieval: semantic recall where keywords miss, identifier safety, toggles, degrade, filters, dims."""

from __future__ import annotations

import uuid

import numpy as np
import jsonschema
import pytest
from helpers import db_of, make_corpus, mcp_client, running_api
from pgvector import Vector
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import lexical, vector
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

GATEWAY = ("The API gateway returned a connection timeout after thirty seconds while the upstream service "
           "was overloaded; retry with backoff. ")


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    root = tmp_path_factory.mktemp("hybrid")
    files = {f"gateway-{i:02d}.md": GATEWAY * 2 + f"Incident number {i}." for i in range(25)}
    files["pets.md"] = "The feline rested quietly upon the woven rug by the fireplace."
    files["licence.md"] = "Code ERR4021: the licence file is missing from the installation directory."
    files["garden.md"] = "Tomatoes need full sun, regular watering and support stakes."
    main = make_corpus(owner_engine, worker_engine, root / "kb", files, tenant="hyb")
    off = admin.add_source(db_of(owner_engine), "hyb", protocol="fs", config={"root": str(root / "kb")},
                           name="no-hybrid", hybrid=False)
    from helpers import Corpus, crawl
    crawl(worker_engine, Corpus("hyb", main.tenant_id, off.id, root / "kb"))
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=main.tenant_id, batch=16) > 0
    tokens = {"hyb": admin.create_token(db_of(owner_engine), tenant_name="hyb", name="h")[0]}
    settings = Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, "main": main, "off": off, "token": tokens["hyb"]}


mcp = mcp_client


async def search(world, **args):
    async with mcp(world["url"], world["token"]) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        structured = (await client.call_tool("search_content", args)).structured_content
    jsonschema.validate(structured, schema)  # explain, degraded and hybrid results included
    return structured


async def test_hybrid_recalls_a_paraphrase_the_keyword_arm_misses(world):
    query = "cat sleeping on a carpet"
    lexical_only = await search(world, query=query, mode="lexical")
    hybrid = await search(world, query=query, explain=True)
    assert "pets.md" not in [h["key"] for h in lexical_only["hits"]]
    assert hybrid["mode"] == "hybrid" and not hybrid["degraded"]
    top = hybrid["hits"][0]
    assert top["key"] == "pets.md" and top["explain"]["vector_rank"] == 1
    assert top["explain"]["lexical_rank"] is None


async def test_a_rare_exact_identifier_stays_on_top(world):
    result = await search(world, query="gateway connection timeout ERR4021 upstream overloaded", explain=True)
    assert result["hits"][0]["key"] == "licence.md"
    assert result["hits"][0]["explain"]["pinned_identifier"] is True


async def test_ten_hits_are_not_one_document(world):
    result = await search(world, query="gateway timeout retry backoff", limit=10)
    keys = [h["key"] for h in result["hits"]]
    assert max(keys.count(k) for k in set(keys)) <= 3


async def test_a_source_with_hybrid_off_is_neither_embedded_nor_searched_semantically(world, owner_engine):
    with owner_engine.connect() as conn:
        embedded = conn.execute(text("SELECT count(embedding) FROM chunks WHERE source_id = :s"),
                                {"s": world["off"].id}).scalar()
    assert embedded == 0
    off = await search(world, query="cat sleeping on a carpet", source_id=str(world["off"].id))
    assert off["mode"] == "lexical" and off["degraded"] and "source" in off["degraded_reason"]


async def test_tenant_toggle_off_degrades_to_lexical(world, owner_engine):
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE tenants SET hybrid_enabled = false WHERE name = 'hyb'"))
    try:
        result = await search(world, query="cat sleeping on a carpet")
    finally:
        with owner_engine.begin() as conn:
            conn.execute(text("UPDATE tenants SET hybrid_enabled = true WHERE name = 'hyb'"))
    assert result["mode"] == "lexical" and result["degraded"] and "tenant" in result["degraded_reason"]


async def test_capacity_and_list_sources_report_embedding_progress(world):
    import httpx

    async with httpx.AsyncClient() as http:
        capacity = (await http.get(f"{world['url']}/capacity",
                                   headers={"Authorization": f"Bearer {world['token']}"})).json()
    hybrid = capacity["modes"]["hybrid"]
    assert hybrid["available"] is True and hybrid["dimensions"] == 384
    assert hybrid["embedding_progress"]["embedded_chunks"] > 0
    async with mcp(world["url"], world["token"]) as client:
        sources = (await client.call_tool("list_sources", {})).structured_content["sources"]
    by_name = {s["name"]: s["embedding"] for s in sources}
    assert by_name["kb"]["embedded"] == by_name["kb"]["total"] > 0 and by_name["kb"]["active"]
    assert by_name["kb"]["eta_s"] == 0.0  # nothing of it is left to embed
    assert by_name["no-hybrid"] == {"embedded": 0, "total": by_name["no-hybrid"]["total"], "active": False,
                                    "chunks_per_s": None, "eta_s": None}


async def test_without_an_embedder_hybrid_degrades_transparently(owner_url, world):
    with running_api(owner_url) as url:
        result = await search({"url": url, "token": world["token"]}, query="cat sleeping on a carpet")
    assert result["mode"] == "lexical" and result["degraded"] and "no embedder" in result["degraded_reason"]


@pytest.fixture(scope="module")
def synthetic(owner_engine):
    """3,000 chunks in 100 files with random 384-d vectors of a synthetic model; one file = 1% of them."""
    tenant = admin.create_tenant(db_of(owner_engine), f"vec-{uuid.uuid4().hex[:8]}")
    with owner_engine.begin() as conn:
        sid = conn.execute(text("INSERT INTO sources (tenant_id, name, protocol) VALUES (:t, 's', 'fs') RETURNING id"),
                           {"t": tenant.id}).scalar()
        conn.execute(text("""
            INSERT INTO files (tenant_id, source_id, key, status, chunk_count)
            SELECT :t, :s, 'dir-' || (i % 10) || '/file-' || i || '.txt', 'ok', 30 FROM generate_series(0, 99) i"""),
                     {"t": tenant.id, "s": sid})
        conn.execute(text("""
            INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, char_start, char_end, embedding,
                                embedding_model)
            SELECT f.tenant_id, f.source_id, f.id, n, 'x', 0, 1,
                   (SELECT array_agg(random() - 0.5) FROM generate_series(1, 384) WHERE n >= 0 AND f.id > 0)::vector,
                   'synthetic@test'
              FROM files f, generate_series(0, 29) n WHERE f.source_id = :s"""), {"s": sid})
        conn.execute(text("SELECT kdbl_ensure_vector_index(384)"))
        conn.execute(text("ANALYZE chunks"))
    return tenant, sid


async def test_vector_arm_keeps_recall_when_a_filter_keeps_one_percent(api_pool, owner_engine, synthetic):
    tenant, sid = synthetic
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT c.id, c.embedding::text FROM chunks c JOIN files f ON f.id = c.file_id "
                                 "WHERE f.key = 'dir-7/file-7.txt'")).all()
    ids = np.array([r[0] for r in rows])
    mat = np.array([[float(x) for x in r[1].strip("[]").split(",")] for r in rows])
    rng = np.random.default_rng(7)
    principal = Principal(tenant_id=tenant.id, tenant_name=tenant.name, subject="user:v")
    recalls = []
    for _ in range(10):
        q = rng.normal(size=384)
        cos = mat @ q / (np.linalg.norm(mat, axis=1) * np.linalg.norm(q))
        exact = set(ids[np.argsort(-cos)[:10]].tolist())
        async with rls_transaction(api_pool, principal) as conn:
            hits = await vector.search(conn, q.tolist(), "synthetic@test", lexical.Filters(path="dir-7/file-7.txt"),
                                       limit=10)
        assert {h.key for h in hits} == {"dir-7/file-7.txt"}
        recalls.append(len(exact & {h.chunk_id for h in hits}) / 10)
    assert np.mean(recalls) >= 0.9, recalls


async def test_a_new_model_re_embeds_old_vectors_of_another_dimension(owner_engine, worker_engine, tmp_path,
                                                                      embedder, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"dim-{unique}",
                         {"a.md": "alpha text", "b.md": "beta text"}, tenant=f"dim-{unique}")
    with db_of(owner_engine).connection() as conn:  # as if an older 8-dimensional model had embedded them
        conn.execute("UPDATE chunks SET embedding = %(v)s, embedding_model = 'old-8d' WHERE source_id = %(s)s",
                     {"v": Vector([0.1] * 8), "s": corpus.source_id})
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id) == 2
    with owner_engine.connect() as conn:
        dims = conn.execute(text("SELECT DISTINCT vector_dims(embedding), embedding_model FROM chunks "
                                 "WHERE source_id = :s"), {"s": corpus.source_id}).all()
    assert dims == [(384, embedder.model_id)]
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id) == 0
