"""Large files index completely in one crawl, with small files around them, and are searchable (issue 12).

A plain-text file of a few MB (thousands of chunks) used to hang the crawl for good: psycopg's pipeline
mode left the one big write half-sent while it waited for results (Postgres in ClientRead). Each pipelined
statement is now drained before the next (kdbl_core.content.store._drain).
"""

from __future__ import annotations

from helpers import make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical
from kdbl_worker.bench_crawl import big_text


async def test_a_10_mb_text_and_50000_short_lines_index_in_one_crawl_and_are_searchable(
        owner_engine, worker_engine, api_pool, tmp_path, unique):
    files: dict[str, str] = {f"small-{i}.md": f"# Note {i}\n\nA small note about topic {i}." for i in range(20)}
    files["novel.txt"] = big_text(10) + "\n\nIn the end the quokkaberry was found.\n"
    files["lines.txt"] = "".join(f"entry {i} ok\n" for i in range(49_999)) + "entry 49999 zanzibarite\n"
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"big-{unique}", files, tenant=f"big-{unique}")
    with owner_engine.connect() as conn:
        rows = {r.key: r for r in conn.execute(text(
            "SELECT f.key, f.status, f.chunk_count, (SELECT count(*) FROM chunks c WHERE c.file_id = f.id) AS n, "
            "(SELECT max(c.char_end) FROM chunks c WHERE c.file_id = f.id) AS last "
            "FROM files f WHERE f.source_id = :s"), {"s": corpus.source_id})}
    assert len(rows) == len(files) and all(r.status == "ok" for r in rows.values())
    assert rows["novel.txt"].chunk_count == rows["novel.txt"].n > 5_000
    assert rows["novel.txt"].last >= 10_000_000
    assert rows["lines.txt"].chunk_count == rows["lines.txt"].n > 300
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        novel = await bm25_topk.search(conn, "quokkaberry", lexical.Filters(), limit=5, ts_config="english")
        lines = await bm25_topk.search(conn, "zanzibarite", lexical.Filters(), limit=5, ts_config="english")
        small = await bm25_topk.search(conn, "topic", lexical.Filters(), limit=50, ts_config="english")
    assert [h.key for h in novel] == ["novel.txt"] and novel[0].seq == rows["novel.txt"].n - 1
    assert [h.key for h in lines] == ["lines.txt"] and lines[0].seq == rows["lines.txt"].n - 1
    assert len(small) == 20
