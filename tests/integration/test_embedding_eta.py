"""The embedding ETA (issue 29): each embedding process's rate in embedding_rate, summed over the live
ones, the tenant's pending chunks divided by it; `kdbl-control up`'s progress line."""

from __future__ import annotations

import uuid

import pytest
from helpers import db_of, make_corpus
from sqlalchemy import text

from kdbl_control.up import EmbeddingProgress, embedding_line
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import vectors
from kdbl_worker.vectorize import HOLDER, embed_pending



async def _backlog(api_pool, corpus, model_id):
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        return await vectors.backlog(conn, model_id)


@pytest.mark.asyncio
async def test_the_eta_is_the_pending_chunks_over_the_live_embedders_rate(owner_engine, worker_engine, api_pool,
                                                                           embedder, tmp_path, capsys):
    name = f"eta-{uuid.uuid4().hex[:10]}"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "eta",
                         {f"n{i}.md": f"numbat survey number {i} of the woodland" for i in range(20)}, tenant=name)
    model = embedder.model_id
    before = await _backlog(api_pool, corpus, model)
    assert before == {"hybrid_chunks": 20, "embedded_chunks": 0, "chunks_per_s": None, "eta_s": None}

    worker = db_of(worker_engine)
    progress = EmbeddingProgress(worker, model, every_s=0.0, tenant=name)  # `up`'s, printing every batch
    assert progress.pending == 20
    assert embed_pending(worker, embedder, tenant_id=corpus.tenant_id, batch=4, max_batches=2,
                         progress=progress) == 8
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" chunks (")[0] for line in lines] == [
        "kdbl: embedding for hybrid search: 4 of 20", "kdbl: embedding for hybrid search: 8 of 20"]
    assert lines[-1].endswith(" left") and "(40%)" in lines[-1]
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT holder, chunks_per_s FROM embedding_rate WHERE tenant_id = :t"),
                            {"t": corpus.tenant_id}).all()
    assert [r.holder for r in rows] == [HOLDER] and rows[0].chunks_per_s > 0
    during = await _backlog(api_pool, corpus, model)
    assert during["embedded_chunks"] == 8 and during["chunks_per_s"] == pytest.approx(rows[0].chunks_per_s, rel=0.01)
    assert during["eta_s"] == pytest.approx(12 / rows[0].chunks_per_s, rel=0.02, abs=0.06)  # to 0.1 s

    # a second process embedding the same tenant adds its rate; one silent for minutes drops out
    with owner_engine.begin() as conn:
        conn.execute(text("INSERT INTO embedding_rate (tenant_id, model, holder, chunks_per_s, updated_at) VALUES "
                          "(:t, :m, 'other:1', 100, now()), (:t, :m, 'gone:2', 5000, now() - interval '10 minutes')"),
                     {"t": corpus.tenant_id, "m": model})
    both = await _backlog(api_pool, corpus, model)
    assert both["chunks_per_s"] == pytest.approx(rows[0].chunks_per_s + 100, rel=0.01)

    assert embed_pending(worker, embedder, tenant_id=corpus.tenant_id, batch=8) == 12
    done = await _backlog(api_pool, corpus, model)
    assert done["embedded_chunks"] == 20 and done["eta_s"] == 0.0


def test_up_says_the_time_left_in_seconds_minutes_or_hours():
    assert embedding_line(1_234, 10_000, 21.0) == (
        "embedding for hybrid search: 1,234 of 10,000 chunks (12%), 21.0 chunks/s, about 7 min left")
    assert embedding_line(0, 50, 0.0).endswith("0.0 chunks/s, time left unknown")
    assert "about 6.0 h left" in embedding_line(0, 450_000, 21.0)
    assert "about 45 s left" in embedding_line(100, 1_045, 21.0)
