"""The worker writes chunk vectors through the psycopg pool's pgvector adapter (binary), stored as halfvec."""

from __future__ import annotations

import numpy as np
from helpers import db_of, make_corpus

from kdbl_core.access.principal import tenant_transaction
from kdbl_core.content import vectors


def test_a_stored_vector_reads_back_as_its_half_precision_value(owner_engine, worker_engine, tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "vec", {"a.md": "alpha text"},
                         tenant=f"vec-{unique}")
    pool = db_of(worker_engine)
    # Sent in binary as float32, stored as halfvec (migration 0020): each component rounded to the nearest
    # float16 once, by the server, and read back exactly as that (a subnormal one included)
    values = np.array([0.1234567891, -0.9876543219, 1e-6 / 3, 0.5], dtype=np.float32)
    with tenant_transaction(pool, corpus.tenant_id) as conn:
        [(chunk_id, _)] = vectors.claim_pending(conn, "exact-4d", 10)
        vectors.store(conn, "exact-4d", [(chunk_id, values.tolist())])
    with tenant_transaction(pool, corpus.tenant_id) as conn:
        row = conn.execute("SELECT embedding, embedding_model FROM chunks WHERE id = %s", (chunk_id,)).fetchone()
        assert vectors.claim_pending(conn, "exact-4d", 10) == []  # stored under this model: not pending
    assert row.embedding_model == "exact-4d"
    assert row.embedding.to_numpy().tobytes() == values.astype(np.float16).tobytes()


def test_a_tenant_transaction_sees_only_its_tenants_chunks(owner_engine, worker_engine, tmp_path, unique):
    one = make_corpus(owner_engine, worker_engine, tmp_path / "one", {"a.md": "alpha text"}, tenant=f"one-{unique}")
    two = make_corpus(owner_engine, worker_engine, tmp_path / "two", {"b.md": "beta text"}, tenant=f"two-{unique}")
    with tenant_transaction(db_of(worker_engine), one.tenant_id) as conn:
        seen = {r.source_id for r in conn.execute("SELECT DISTINCT source_id FROM chunks")}
    assert seen == {one.source_id}
    assert two.source_id not in seen


def test_what_is_embedded_is_the_chunks_header_then_its_text(owner_engine, worker_engine, tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "hdr",
                         {"reports/3M_2018_10K.md": "# Liquidity\n\n## Cash flows\n\nCapital spending rose.",
                          "12345.txt": "An abstract named by its id alone."}, tenant=f"hdr-{unique}")
    with tenant_transaction(db_of(worker_engine), corpus.tenant_id) as conn:
        bodies = dict(vectors.claim_pending(conn, "any-model", 10)).values()
    # the name (folders after it), then the heading path (the title, "Liquidity", is in it: once), then the
    # chunk's text; a name of digits alone says nothing: the text only
    assert "3M_2018_10K / reports | Liquidity > Cash flows\n\n# Liquidity\n\n## Cash flows\n\nCapital spending rose." \
        in bodies
    assert "An abstract named by its id alone." in bodies


def test_the_embedded_text_keeps_only_header_parts_with_a_letter():
    from kdbl_core.content.analysis import embedding_text

    assert embedding_text("a/b/Annual report.pdf", "0001018724-21-000004", "Notes > Leases", "Body.") == \
        "Annual report / b / a | Notes > Leases\n\nBody."
    assert embedding_text("2020/123.txt", None, None, "Body.") == "Body."
    assert embedding_text("x.zip!/inner.md", "Packed manual", None, "Body.") == "inner / x.zip | Packed manual\n\nBody."
