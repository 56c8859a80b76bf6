"""Every migration downgrades and upgrades again on a real database (a fresh embedded server)."""

from __future__ import annotations

from psycopg.rows import tuple_row

from kdbl_core.db import migrate
from kdbl_core.db.connect import sync_pool
from kdbl_core.db.embedded_postgres import EmbeddedDatabase


def _progress_body(url: str) -> str | None:
    with sync_pool(url, size=1) as pool, pool.connection() as conn:
        row = conn.execute(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = 'kdbl_embedding_progress'"
        ).fetchone()
    return row[0] if row else None


def test_down_to_the_first_migration_and_up_again(pg_dir) -> None:
    with EmbeddedDatabase(pg_dir) as db:
        url = db.owner_url
        head = migrate.current_revision(url)
        assert head is not None and _progress_body(url) is None  # 0011 dropped the unused function
        migrate.downgrade(url, "0010")  # 0011 gives it back its 0006 body (source_stats totals)
        assert "source_stats" in (_progress_body(url) or "")
        migrate.downgrade(url, "0005")  # 0006 gives the function back its 0004 body
        body = _progress_body(url) or ""
        assert "count(c.embedding)" in body and "source_stats" not in body
        migrate.downgrade(url, "0001")
        assert migrate.current_revision(url) == "0001" and _progress_body(url) is None
        migrate.upgrade(url)
        assert migrate.current_revision(url) == head and _progress_body(url) is None


def _stats(url: str, per_source: bool) -> tuple[set, set]:
    """(term_stats, corpus_stats) summed to (tenant[, source], term) / (tenant[, source]) rows."""
    key = "tenant_id, source_id" if per_source else "tenant_id"
    with sync_pool(url, size=1) as pool, pool.connection() as db:
        conn = db.cursor(row_factory=tuple_row)  # plain tuples: two `sum` columns
        terms = set(map(tuple, conn.execute(
            f"SELECT {key}, term, sum(df) FROM term_stats GROUP BY {key}, term HAVING sum(df) <> 0")))
        corpus = set(map(tuple, conn.execute(
            f"SELECT {key}, sum(n_chunks), sum(total_len) FROM corpus_stats GROUP BY {key}")))
        truth_terms = set(map(tuple, conn.execute(
            f"SELECT {key}, term, count(*) FROM postings GROUP BY {key}, term")))
        truth_corpus = set(map(tuple, conn.execute(
            f"SELECT {key}, count(*), sum(token_count) FROM chunks GROUP BY {key}")))
    assert terms == truth_terms and corpus == truth_corpus
    return terms, corpus


def test_per_source_statistics_are_backfilled_and_summed_back_on_downgrade(pg_dir, monkeypatch) -> None:
    from kdbl_control import admin
    from kdbl_core.access.principal import tenant_transaction
    from kdbl_core.content import store
    from kdbl_core.content.records import Chunk, FileMeta

    monkeypatch.setattr(store, "writes_packed", lambda conn: False)  # postings rows: _stats's truth
    with EmbeddedDatabase(pg_dir) as db:
        url = db.owner_url
        with sync_pool(url) as owner:
            tenant = admin.create_tenant(owner, "mig")
            sources = [admin.add_source(owner, "mig", protocol="fs", config={"root": str(pg_dir)}, name=name)
                       for name in ("one", "two")]
            for source, words in zip(sources, ("alpha beta", "alpha gamma"), strict=True):
                name = source.name
                for i in range(3):
                    body = f"{words} number {i}"
                    with tenant_transaction(owner, tenant.id) as conn:
                        store.write_file(conn, tenant_id=tenant.id, source_id=source.id,
                                           meta=FileMeta(key=f"{name}{i}.txt"), status="ok",
                                           status_reason=None, title=None, text_chars=len(body),
                                           ts_config="english",
                                           chunks=[Chunk(0, body, 0, len(body))])
        per_source, _ = _stats(url, per_source=True)
        assert {(row[2], row[3]) for row in per_source if row[2] == "alpha"} == {("alpha", 3)}  # 3 per source
        migrate.downgrade(url, "0006")
        tenant_wide, _ = _stats(url, per_source=False)
        assert {(row[1], row[2]) for row in tenant_wide if row[1] == "alpha"} == {("alpha", 6)}
        migrate.upgrade(url)
        assert _stats(url, per_source=True)[0] == per_source


def _vectors(url: str) -> tuple[str, list[tuple[int, list[float]]], list[str]]:
    """(the column's type, every (chunk id, vector), the HNSW indexes' definitions)."""
    with sync_pool(url, size=1) as pool, pool.connection() as conn:
        [kind] = conn.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                              "WHERE attrelid = 'chunks'::regclass AND attname = 'embedding'").fetchone()
        rows = [(r[0], [float(x) for x in r[1].to_list()])
                for r in conn.execute("SELECT id, embedding FROM chunks WHERE embedding IS NOT NULL ORDER BY id")]
        indexes = [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE tablename = 'chunks' "
                                              "AND indexname LIKE 'chunks_embedding_%%_hnsw'")]
    return kind, rows, indexes


def test_vectors_become_halfvec_in_place_and_back_with_their_hnsw_index(pg_dir) -> None:
    import numpy as np

    from kdbl_control import admin
    from kdbl_core.access.principal import tenant_transaction
    from kdbl_core.content import store, vectors
    from kdbl_core.content.records import Chunk, FileMeta

    rng = np.random.default_rng(20)
    with EmbeddedDatabase(pg_dir) as db:
        url = db.owner_url
        with sync_pool(url) as owner:  # written at head (today's write path), then taken back to 0019
            tenant = admin.create_tenant(owner, "vec")
            source = admin.add_source(owner, "vec", protocol="fs", config={"root": str(pg_dir)}, name="one")
            for i in range(4):
                body = f"vector text number {i}"
                with tenant_transaction(owner, tenant.id) as conn:
                    store.write_file(conn, tenant_id=tenant.id, source_id=source.id, meta=FileMeta(key=f"{i}.txt"),
                                     status="ok", status_reason=None, title=None, text_chars=len(body),
                                     ts_config="english", chunks=[Chunk(0, body, 0, len(body))])
            with tenant_transaction(owner, tenant.id) as conn:
                pending = vectors.claim_pending(conn, "m", 10)
                vectors.store(conn, "m", [(cid, rng.standard_normal(8).astype(np.float32).tolist())
                                          for cid, _ in pending])
            with owner.connection() as conn:
                vectors.ensure_vector_index(conn, 8)
        migrate.downgrade(url, "0019")
        kind, before, indexes = _vectors(url)
        assert kind == "vector" and len(before) == 4 and "vector_cosine_ops" in indexes[0]
        migrate.upgrade(url)  # 0020: converted in place, nothing re-embedded, the index rebuilt on halfvec
        kind, after, indexes = _vectors(url)
        assert kind == "halfvec" and len(indexes) == 1 and "halfvec_cosine_ops" in indexes[0]
        assert [cid for cid, _ in after] == [cid for cid, _ in before]
        for (_, old), (_, new) in zip(before, after, strict=True):
            assert new == np.array(old, dtype=np.float32).astype(np.float16).astype(float).tolist()
        migrate.downgrade(url, "0019")
        kind, back, indexes = _vectors(url)
        assert kind == "vector" and back == after and "vector_cosine_ops" in indexes[0]
        migrate.upgrade(url)


def _keyword_records(url: str) -> tuple[set, set]:
    """(every postings row, every chunk's (id, terms, tfs)) where the columns exist."""
    with sync_pool(url, size=1) as pool, pool.connection() as db:
        conn = db.cursor(row_factory=tuple_row)
        rows = set(conn.execute("SELECT chunk_id, term, tf, dl, source_id, file_id FROM postings"))
        has_terms = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'chunks'::regclass "
                                 "AND attname = 'terms' AND NOT attisdropped)").fetchone()[0]
        vectors = conn.execute("SELECT id, terms, tfs FROM chunks").fetchall() if has_terms else []
    return rows, {(i, tuple(t.split(" ") if t else ()), tuple(f or ())) for i, t, f in vectors}


def test_chunk_terms_are_filled_from_the_postings_and_give_them_back_on_downgrade(pg_dir, monkeypatch) -> None:
    import psycopg

    from kdbl_control import admin
    from kdbl_core.access.principal import tenant_transaction
    from kdbl_core.content import bm25_lists, store
    from kdbl_core.content.records import Chunk, FileMeta
    from kdbl_core.db.connect import conninfo

    def write(owner, tenant, source, files) -> None:
        for i in files:
            body = f"alpha beta beta number {i} " + "gamma " * (i % 5)
            with tenant_transaction(owner, tenant.id) as conn:
                store.write_file(conn, tenant_id=tenant.id, source_id=source.id, meta=FileMeta(key=f"{i}.txt"),
                                 status="ok", status_reason=None, title=None, text_chars=len(body),
                                 ts_config="english", chunks=[Chunk(0, body, 0, len(body)),
                                                              Chunk(1, "", len(body), len(body))])

    with EmbeddedDatabase(pg_dir) as db:
        url = db.owner_url
        with sync_pool(url) as owner:  # written as a database without the extension writes: postings rows
            tenant = admin.create_tenant(owner, "terms")
            source = admin.add_source(owner, "terms", protocol="fs", config={"root": str(pg_dir)}, name="one")
            with monkeypatch.context() as m:
                m.setattr(store, "writes_packed", lambda conn: False)
                write(owner, tenant, source, range(40))
        rows, written = _keyword_records(url)
        # the write path's vector is the postings' (term, tf), sorted; a chunk without text has none
        by_chunk: dict[int, list] = {}
        for chunk_id, term, tf, *_ in sorted(rows):
            by_chunk.setdefault(chunk_id, []).append((term, tf))
        assert {(i, tuple(t for t, _ in v), tuple(f for _, f in v)) for i, v in by_chunk.items()} == \
            {w for w in written if w[1]} and sum(1 for w in written if not w[1]) == 40
        with psycopg.connect(conninfo(url)) as conn:
            built = bm25_lists.build(conn, tenant.id)
        assert built["postings_rows_pruned"] == len(rows) and _keyword_records(url)[0] == set()
        with sync_pool(url) as owner:  # and some written since, packed by their writers (no rows)
            write(owner, tenant, source, range(40, 45))
        _, written = _keyword_records(url)
        with sync_pool(url, size=1) as pool, pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM bm25_lists WHERE gen < 0").fetchone()[0] > 0
            every = {tuple(r) for r in conn.execute(
                "SELECT c.id, t.term, t.tf, c.token_count, c.source_id, c.file_id FROM chunks c "
                "CROSS JOIN LATERAL unnest(string_to_array(c.terms, ' '), c.tfs) AS t(term, tf)")}
        assert rows < every and _keyword_records(url)[0] == set()
        migrate.downgrade(url, "0020")  # every postings row back, from the chunks' terms
        restored, _ = _keyword_records(url)
        assert restored == every
        with sync_pool(url, size=1) as pool, pool.connection() as conn:
            assert conn.execute("SELECT count(*) FROM bm25_lists WHERE gen < 0").fetchone()[0] == 0
        migrate.upgrade(url)  # and the terms filled again from those rows
        assert _keyword_records(url) == (every, written)
