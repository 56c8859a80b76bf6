"""Per-source counters stay exact through every write path, and never reveal totals a principal cannot see."""

from __future__ import annotations

import pytest
from helpers import crawl, db_of, make_corpus
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import reads, vectors
from kdbl_core.embedder import Embedder
from kdbl_worker.vectorize import embed_pending

DOCS = {"a.txt": "alpha " * 300, "b.md": "# Bravo\n\nbravo text", "sub/c.txt": "charlie " * 700, "d.txt": "delta"}


def _counters(owner_engine, source_id) -> dict[str, tuple[int, int]]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT model, sum(files)::int, sum(chunks)::int FROM source_stats "
                                 "WHERE source_id = :s GROUP BY model"), {"s": source_id}).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def _truth(owner_engine, source_id) -> dict[str, tuple[int, int]]:
    with owner_engine.connect() as conn:
        files = conn.execute(text("SELECT count(*) FROM files WHERE source_id = :s"), {"s": source_id}).scalar()
        rows = conn.execute(text("SELECT '' AS m, count(*) FROM chunks WHERE source_id = :s UNION ALL "
                                 "SELECT embedding_model, count(*) FROM chunks WHERE source_id = :s AND embedding "
                                 "IS NOT NULL GROUP BY embedding_model"), {"s": source_id}).all()
    out = {m: (0, n) for m, n in rows if n}
    out[""] = (files, out.get("", (0, 0))[1])
    return out


def test_counters_follow_crawl_edits_deletes_embedding_and_model_change(owner_engine, worker_engine, tmp_path,
                                                                         unique, embed_model_path):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "st", DOCS, tenant=f"st-{unique}")
    assert _counters(owner_engine, corpus.source_id) == _truth(owner_engine, corpus.source_id)
    assert _counters(owner_engine, corpus.source_id)[""][0] == 4

    (corpus.root / "a.txt").write_text("alpha changed " * 900)  # more chunks
    (corpus.root / "sub" / "c.txt").unlink()
    (corpus.root / "e.txt").write_text("echo")
    crawl(worker_engine, corpus)
    assert _counters(owner_engine, corpus.source_id) == _truth(owner_engine, corpus.source_id)

    embedder = Embedder(embed_model_path)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=corpus.tenant_id) > 0
    truth = _truth(owner_engine, corpus.source_id)
    assert truth[embedder.model_id][1] == truth[""][1]  # all embedded
    assert _counters(owner_engine, corpus.source_id) == truth

    # a model change moves chunks between model counters
    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE chunks SET embedding_model = 'old-model' WHERE source_id = :s AND seq = 0"),
                     {"s": corpus.source_id})
    assert _counters(owner_engine, corpus.source_id) == _truth(owner_engine, corpus.source_id)

    # deleting the source takes its counters with it (the cascade must not re-create them)
    with owner_engine.begin() as conn:
        conn.execute(text("DELETE FROM sources WHERE id = :s"), {"s": corpus.source_id})
        left = conn.execute(text("SELECT count(*) FROM source_stats WHERE source_id = :s"),
                            {"s": corpus.source_id}).scalar()
    assert left == 0


@pytest.mark.asyncio
async def test_a_principal_with_file_grants_sees_only_its_own_counts(owner_engine, worker_engine, api_pool,
                                                                     tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "rs", DOCS, tenant=f"rs-{unique}",
                         restricted=True)
    admin.add_grant(db_of(owner_engine), source_id=corpus.source_id, subject="user:ann", file_key="d.txt")
    ann = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:ann")
    async with rls_transaction(api_pool, ann) as conn:
        [row] = await reads.list_sources(conn, after=None, limit=10)
        progress = await vectors.source_progress(conn, [corpus.source_id], "m")
    assert row["file_count"] == 1  # not the source's 4
    assert progress[corpus.source_id]["total"] == 1
    admin.set_source_acl(db_of(owner_engine), corpus.source_id, restricted=False)
    async with rls_transaction(api_pool, ann) as conn:
        [row] = await reads.list_sources(conn, after=None, limit=10)
        assert (await (await conn.execute("SELECT count(*) FROM source_stats")).fetchone())[0] > 0
    assert row["file_count"] == 4
