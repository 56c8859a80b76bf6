"""The keyword arm over packed posting lists (the kdbl_bm25 extension, migration 0017): the exhaustive top
k whatever the lists' age — before any build, after one, with files written, re-indexed and deleted
since, under source filters, for a principal granted one file — and a build that waits for chunk writers."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import psycopg
import pytest
from helpers import crawl, grants_world, make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import bm25_lists
from kdbl_core.db import pgext
from kdbl_core.db.connect import conninfo
from kdbl_core.db.embedded_postgres import pg_binary
from kdbl_core.errors import Unavailable
from kdbl_core.search import bm25_native, bm25_topk, lexical


def _zipf_files(seed: int, docs: int, vocab: list[str]) -> dict[str, str]:
    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(vocab))]
    return {f"d{n:03}.txt": " ".join(rng.choices(vocab, weights, k=rng.randint(5, 60))) for n in range(docs)}


VOCAB = [f"w{i}x" for i in range(300)]


def _queries(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(VOCAB[:3], 2) + rng.sample(VOCAB[3:80], rng.randint(1, 4))) for _ in range(n)]


async def _agree(api_pool, principal: Principal, queries: list[str], filters=lexical.Filters()) -> int:
    """Native and exhaustive give the same ids in the same order and the same scores; the hits compared."""
    compared = 0
    for n, query in enumerate(queries):
        limit = (3, 10, 21)[n % 3]
        async with rls_transaction(api_pool, principal) as conn:
            assert await bm25_native.available(conn)
            native = await bm25_topk.search(conn, query, filters, limit=limit, ts_config="english")
            full = await bm25_topk.search(conn, query, filters, limit=limit, ts_config="english", exhaustive=True)
        assert [h.chunk_id for h in native] == [h.chunk_id for h in full], (query, [(h.chunk_id, repr(h.score)) for h in native][15:], [(h.chunk_id, repr(h.score)) for h in full][15:])
        assert [h.score for h in native] == pytest.approx([h.score for h in full], rel=1e-12)
        assert [(h.key, h.seq, h.file_id, h.source_id) for h in native] == [
            (h.key, h.seq, h.file_id, h.source_id) for h in full]
        compared += len(full)
    return compared


async def _rankings(api_pool, principal: Principal, queries: list[str]) -> list[list[tuple[int, float]]]:
    out = []
    for query in queries:
        async with rls_transaction(api_pool, principal) as conn:
            hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=21, ts_config="english")
        out.append([(h.chunk_id, round(h.score, 9)) for h in hits])
    return out


def _postings_of_chunks(owner_engine, tenant_id, after: int = 0) -> int:
    """The postings the chunks after id `after` hold: the terms on their rows (migration 0021)."""
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(sum(cardinality(tfs)), 0) FROM chunks "
                                 "WHERE tenant_id = :t AND id > :a"), {"t": tenant_id, "a": after}).scalar()


def _written_lists(owner_engine, tenant_id) -> int:
    """The postings in the writers' own generations (gen < 0: kdbl_core.content.store's packed write)."""
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT coalesce(sum(n), 0) FROM bm25_lists WHERE tenant_id = :t AND gen < 0"),
                            {"t": tenant_id}).scalar()


def _postings_rows(owner_engine, tenant_id) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM postings WHERE tenant_id = :t"), {"t": tenant_id}).scalar()


def _build(owner_url: str, tenant_id, kind="full") -> dict:
    with psycopg.connect(conninfo(owner_url)) as conn:
        return bm25_lists.build(conn, tenant_id, kind)


def test_the_embedded_server_has_the_extension(owner_engine):
    assert pgext.is_built(pgext.default_dir(), Path(pg_binary("pg_config")))  # built for this server, current
    with owner_engine.connect() as conn:
        assert conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = 'kdbl_bm25'")).scalar() == \
            pgext.VERSION
        packed = conn.execute(text(
            "SELECT kdbl_bm25_pack(id, tf, dl ORDER BY id) FROM (VALUES (CAST(5 AS bigint), 1, 10), "
            "(3, 2, 7), (9007199254740000, 300, 70000)) v(id, tf, dl)")).scalar()
        assert conn.execute(text("SELECT array_agg(ARRAY[chunk_id, tf, dl]) FROM kdbl_bm25_unpack(:l)"),
                            {"l": packed}).scalar() == [[3, 2, 7], [5, 1, 10], [9007199254740000, 300, 70000]]
        with pytest.raises(Exception, match="corrupt|short|version"):
            conn.execute(text("SELECT * FROM kdbl_bm25_unpack(:l)"), {"l": packed[:-3] + b"\x80\x80\x80"})


@pytest.mark.asyncio
async def test_native_equals_exhaustive_before_and_after_a_build_and_through_writes_since(
        owner_engine, worker_engine, owner_url, tmp_path, unique, api_pool):
    root = tmp_path / f"nat-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, root, _zipf_files(7, 240, VOCAB), tenant=f"nat-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    queries = _queries(11, 30)
    assert await _agree(api_pool, principal, queries) > 300  # no build yet: the lists each writer packed
    as_written = await _rankings(api_pool, principal, queries)
    postings = _postings_of_chunks(owner_engine, corpus.tenant_id)
    # with the extension, each file's writer packed its own postings (no postings rows at all)
    assert _written_lists(owner_engine, corpus.tenant_id) == postings > 5000
    assert _postings_rows(owner_engine, corpus.tenant_id) == 0

    built = _build(owner_url, corpus.tenant_id)
    with owner_engine.connect() as conn:
        upto = conn.execute(text("SELECT max(id) FROM chunks WHERE tenant_id = :t"), {"t": corpus.tenant_id}).scalar()
    assert built["postings"] == postings and built["upto"] == upto and built["lists"] > 250
    assert built["bytes"] < 8 * postings  # packed: a few bytes a posting
    # the writers' generations are folded into the build's, which ranks exactly as they did
    assert _written_lists(owner_engine, corpus.tenant_id) == 0
    assert await _rankings(api_pool, principal, queries) == as_written
    assert await _agree(api_pool, principal, queries) > 300

    # since the build: files re-indexed (their old chunks dead, new ones after upto), deleted and added
    for n in range(0, 40, 3):
        (root / f"d{n:03}.txt").write_text("w0x w1x w2x w5x w9x " * (n % 4 + 1))
    for n in range(1, 40, 7):
        (root / f"d{n:03}.txt").unlink()
    (root / "new.txt").write_text("w3x w4x w7x w11x w13x")
    crawl(worker_engine, corpus)
    with owner_engine.connect() as conn:
        dead = conn.execute(text("SELECT count(*) FROM bm25_dead WHERE tenant_id = :t"), {"t": corpus.tenant_id}).scalar()
    assert dead == len(set(range(0, 40, 3)) | set(range(1, 40, 7)))  # one chunk a file: each old one, once
    assert await _agree(api_pool, principal, queries) > 300
    assert await _agree(api_pool, principal, queries[:10],
                        lexical.Filters(source_id=corpus.source_id)) > 100
    assert await _agree(api_pool, principal, queries[:5], lexical.Filters(exclude_file_id=_file_id(
        owner_engine, corpus, "d003.txt"))) == 3 + 10 + 21 + 3 + 10

    again = _build(owner_url, corpus.tenant_id)  # the deletions are folded in and forgotten
    with owner_engine.connect() as conn:
        dead = conn.execute(text("SELECT count(*) FROM bm25_dead WHERE tenant_id = :t"), {"t": corpus.tenant_id}).scalar()
    assert dead == 0 and again["upto"] > built["upto"]
    assert await _agree(api_pool, principal, queries) > 300


async def test_a_build_in_term_partitions_packs_the_same_lists(owner_engine, worker_engine, owner_url, tmp_path,
                                                               unique, api_pool, monkeypatch):
    """Past PART_POSTINGS a pack runs one hash partition of the terms at a time (its sort's temporary files
    stay bounded: 10M chunks asked for more than 44 GB in one): the lists are byte for byte the same."""
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"parts-{unique}", _zipf_files(5, 120, VOCAB),
                         tenant=f"parts-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")

    def lists() -> list:
        with owner_engine.connect() as conn:
            return conn.execute(text("SELECT term, source_id, gen, n, list FROM bm25_lists WHERE tenant_id = :t "
                                     "ORDER BY term, source_id, gen"), {"t": corpus.tenant_id}).all()

    whole = _build(owner_url, corpus.tenant_id)
    one, ranked = lists(), await _rankings(api_pool, principal, _queries(3, 20))
    monkeypatch.setattr(bm25_lists, "PART_POSTINGS", 500)
    parted = _build(owner_url, corpus.tenant_id)
    assert whole["parts"] == 1 and parted["parts"] >= 5 and parted["postings"] == whole["postings"]
    assert lists() == one and await _rankings(api_pool, principal, _queries(3, 20)) == ranked


def _file_id(owner_engine, corpus, key: str) -> int:
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT id FROM files WHERE source_id = :s AND key = :k"),
                            {"s": corpus.source_id, "k": key}).scalar()


@pytest.mark.asyncio
async def test_a_principal_granted_one_file_gets_its_own_top_k_from_the_lists(
        owner_engine, worker_engine, owner_url, tmp_path, unique, api_pool):
    restricted = _zipf_files(3, 120, VOCAB)
    restricted["mine.txt"] = "w0x w1x w2x"  # only common terms: far below the whole source's top k
    ids = grants_world(owner_engine, worker_engine, tmp_path / f"ng-{unique}", prefix=f"ng-{unique}",
                       open_files={"open.txt": "w1x and other words"}, restricted=restricted,
                       granted="mine.txt", other=restricted)
    with owner_engine.connect() as conn:
        tenant_id = conn.execute(text("SELECT id FROM tenants WHERE name = :n"), {"n": ids["tenant"]}).scalar()
    assert "skipped" not in _build(owner_url, tenant_id)  # mine.txt is in a list alice may not read
    alice = Principal(tenant_id=tenant_id, tenant_name=ids["tenant"], subject="user:alice")
    async with rls_transaction(api_pool, alice) as conn:
        mine = await bm25_topk.search(conn, "w0x w1x w2x", lexical.Filters(), limit=5, ts_config="english")
        full = await bm25_topk.search(conn, "w0x w1x w2x", lexical.Filters(), limit=5, ts_config="english",
                                      exhaustive=True)
        lists = (await (await conn.execute("SELECT count(*) FROM bm25_lists")).fetchone())[0]
    assert [h.key for h in mine] == [h.key for h in full] == ["mine.txt", "open.txt"]
    assert [h.score for h in mine] == pytest.approx([h.score for h in full], rel=1e-12)
    assert lists > 0  # the open source's lists, never the restricted ones (row-level security)
    assert await _agree(api_pool, alice, _queries(5, 10)) > 0


def test_a_build_waits_for_uncommitted_chunks_and_covers_them(owner_engine, worker_engine, owner_url, tmp_path,
                                                              unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"nw-{unique}", _zipf_files(5, 20, VOCAB),
                         tenant=f"nw-{unique}")
    with psycopg.connect(conninfo(owner_url)) as writer:  # a chunk insert left open
        file_id = writer.execute("SELECT id FROM files WHERE source_id = %s ORDER BY id LIMIT 1",
                                 (corpus.source_id,)).fetchone()[0]
        [chunk_id] = writer.execute(
            "INSERT INTO chunks (tenant_id, source_id, file_id, seq, text, char_start, char_end, token_count) "
            "VALUES (%s, %s, %s, 9999, 'late', 0, 4, 1) RETURNING id",
            (corpus.tenant_id, corpus.source_id, file_id)).fetchone()
        result: dict = {}
        builder = threading.Thread(target=lambda: result.update(_build(owner_url, corpus.tenant_id)))
        builder.start()
        _wait_until_the_build_waits_for_the_writers(writer, builder)
        assert builder.is_alive() and not result  # waiting for the writer, not reading past it
        writer.commit()
        builder.join(timeout=60)
    assert result["upto"] >= chunk_id


def _wait_until_the_build_waits_for_the_writers(conn, builder: threading.Thread, timeout: float = 60.0) -> None:
    """Until the build's session queues for the chunk writers' lock (bm25_lists.LOCK_KEY, held shared by
    the open insert): an advisory lock not granted, in pg_locks."""
    key = {"hi": bm25_lists.LOCK_KEY >> 32, "lo": bm25_lists.LOCK_KEY & 0xFFFFFFFF}
    deadline = time.monotonic() + timeout
    while not conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 "
            "AND classid = CAST(%(hi)s AS oid) AND objid = CAST(%(lo)s AS oid))", key).fetchone()[0]:
        assert builder.is_alive(), "the build ended without waiting for the uncommitted chunk"
        assert time.monotonic() < deadline, f"the build did not queue for the writers' lock in {timeout} s"
        time.sleep(0.01)


def _built(owner_engine, tenant_id):
    with owner_engine.connect() as conn:
        return conn.execute(text("SELECT upto, postings FROM bm25_built WHERE tenant_id = :t"), {"t": tenant_id}).one_or_none()


def test_a_crawl_run_packs_the_lists_when_enough_changed_since_the_last_build(
        owner_engine, worker_engine, tmp_path, unique, monkeypatch):
    monkeypatch.setattr(bm25_lists, "REBUILD_MIN", 10**9)  # below the threshold: no build, searches still exact
    root = tmp_path / f"nb-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, root, _zipf_files(9, 30, VOCAB), tenant=f"nb-{unique}")
    assert _built(owner_engine, corpus.tenant_id) == (0, 0)  # the writers' mark: nothing built yet
    monkeypatch.setattr(bm25_lists, "REBUILD_MIN", 20)
    for n in range(25):  # 25 of 30 files re-indexed: 25 dead chunks and 25 new ones since no build
        (root / f"d{n:03}.txt").write_text(f"w{n}x w0x w1x")
    crawl(worker_engine, corpus)  # the worker's queue, as the kdbl_worker role, after the run finished
    upto, postings = _built(owner_engine, corpus.tenant_id)
    with owner_engine.connect() as conn:
        assert upto == conn.execute(text("SELECT max(id) FROM chunks WHERE tenant_id = :t"),
                                    {"t": corpus.tenant_id}).scalar()
    assert postings == _postings_of_chunks(owner_engine, corpus.tenant_id) > 100  # every chunk's terms packed
    assert _postings_rows(owner_engine, corpus.tenant_id) == 0  # and their rows deleted
    (root / "d029.txt").write_text("w3x")  # one file: far below 10% of what was built, no new build
    crawl(worker_engine, corpus)
    assert _built(owner_engine, corpus.tenant_id)[0] == upto



@pytest.mark.asyncio
async def test_an_added_generation_packs_only_what_was_written_since_and_searches_stay_exact(
        owner_engine, worker_engine, owner_url, tmp_path, unique, api_pool):
    root = tmp_path / f"ng-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, root, _zipf_files(13, 120, VOCAB), tenant=f"na-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    queries = _queries(17, 24)
    first = _build(owner_url, corpus.tenant_id, "add")  # nothing built yet: a full build
    assert (first["kind"], first["generations"]) == ("full", 1)
    for n in range(0, 30, 2):
        (root / f"d{n:03}.txt").write_text("w0x w1x w6x w8x " * (n % 3 + 1))
    (root / "d031.txt").unlink()
    crawl(worker_engine, corpus)
    added = _build(owner_url, corpus.tenant_id, "add")
    assert (added["kind"], added["generations"]) == ("add", 2) and added["upto"] > first["upto"]
    with owner_engine.connect() as conn:
        by_gen = dict(conn.execute(text("SELECT gen, sum(n) FROM bm25_lists WHERE tenant_id = :t GROUP BY gen"),
                                   {"t": corpus.tenant_id}).all())
        dead = conn.execute(text("SELECT count(*) FROM bm25_dead WHERE tenant_id = :t"), {"t": corpus.tenant_id}).scalar()
    assert by_gen[1] == _postings_of_chunks(owner_engine, corpus.tenant_id, first["upto"])  # only those written since
    assert _postings_rows(owner_engine, corpus.tenant_id) == 0
    assert dead == 16  # the old chunks stay in generation 0: left out until a full build
    assert await _agree(api_pool, principal, queries) > 200
    (root / "d040.txt").write_text("w2x w3x")
    crawl(worker_engine, corpus)
    full = _build(owner_url, corpus.tenant_id, "full")
    with owner_engine.connect() as conn:
        gens = conn.execute(text("SELECT array_agg(DISTINCT gen) FROM bm25_lists WHERE tenant_id = :t"),
                            {"t": corpus.tenant_id}).scalar()
        dead = conn.execute(text("SELECT count(*) FROM bm25_dead WHERE tenant_id = :t"), {"t": corpus.tenant_id}).scalar()
    assert (full["generations"], gens, dead) == (1, [0], 0)
    assert await _agree(api_pool, principal, queries) > 200


def _due(owner_url: str, tenant_id, monkeypatch):
    """due() with REBUILD_MIN 4; crawls run with it out of reach, so the worker builds nothing itself."""
    monkeypatch.setattr(bm25_lists, "REBUILD_MIN", 4)
    try:
        with psycopg.connect(conninfo(owner_url)) as conn:
            return bm25_lists.due(conn, tenant_id)
    finally:
        monkeypatch.setattr(bm25_lists, "REBUILD_MIN", 10**9)


def test_due_adds_a_generation_for_a_few_changes_and_builds_in_full_past_the_limits(
        owner_engine, worker_engine, owner_url, tmp_path, unique, monkeypatch):
    monkeypatch.setattr(bm25_lists, "REBUILD_MIN", 10**9)
    root = tmp_path / f"nd-{unique}"
    corpus = make_corpus(owner_engine, worker_engine, root, _zipf_files(21, 40, VOCAB), tenant=f"nd-{unique}")
    assert _due(owner_url, corpus.tenant_id, monkeypatch) == "full"  # no lists yet
    _build(owner_url, corpus.tenant_id)
    assert _due(owner_url, corpus.tenant_id, monkeypatch) is None  # nothing changed
    for n in range(40, 43):
        (root / f"new{n}.txt").write_text(f"w{n}x w0x")
    crawl(worker_engine, corpus)
    assert _due(owner_url, corpus.tenant_id, monkeypatch) is None  # 3 new chunks: below REBUILD_MIN
    (root / "new43.txt").write_text("w43x")
    crawl(worker_engine, corpus)
    assert _due(owner_url, corpus.tenant_id, monkeypatch) == "add"
    monkeypatch.setattr(bm25_lists, "MAX_GENERATIONS", 1)
    assert _due(owner_url, corpus.tenant_id, monkeypatch) == "full"
    monkeypatch.setattr(bm25_lists, "MAX_GENERATIONS", 8)
    for n in range(0, 8):
        (root / f"d{n:03}.txt").unlink()  # 8 of 44 chunks deleted: past FULL_DEAD_SHARE
    crawl(worker_engine, corpus)
    assert _due(owner_url, corpus.tenant_id, monkeypatch) == "full"


@pytest.mark.asyncio
async def test_an_extension_whose_library_cannot_run_refuses_searches_instead_of_answering_from_part(
        owner_engine, worker_engine, tmp_path, unique, api_pool, monkeypatch):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"nu-{unique}", _zipf_files(21, 12, VOCAB),
                         tenant=f"nu-{unique}")
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    # what an image without kdbl_bm25.so does to the probe: the call fails (the library cannot be loaded)
    monkeypatch.setattr(bm25_native, "_PROBE", "SELECT kdbl_bm25_no_such_function()")
    monkeypatch.setattr(bm25_native, "_available", {})
    async with rls_transaction(api_pool, principal) as conn:
        assert await bm25_native.state(conn) == "unusable" and not await bm25_native.available(conn)
        with pytest.raises(Unavailable, match="kdbl_bm25 extension .* Restore it"):
            await bm25_topk.search(conn, "w0x w1x", lexical.Filters(), limit=5, ts_config="english")
        with pytest.raises(Unavailable):
            await bm25_topk.search_terms(conn, ["w0x"], lexical.Filters(), limit=5)
    monkeypatch.undo()  # the library back (and a fresh check): the same search answers
    monkeypatch.setattr(bm25_native, "_available", {})
    async with rls_transaction(api_pool, principal) as conn:
        assert await bm25_native.state(conn) == "ready"
        assert await bm25_topk.search(conn, "w0x w1x", lexical.Filters(), limit=5, ts_config="english")
