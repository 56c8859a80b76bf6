"""`kdbl-control db compact`: the keyword index's B-trees are rebuilt (REINDEX CONCURRENTLY) with progress, stay
valid, and search answers as before; every tenant's keyword lists are packed again."""

from __future__ import annotations

import json

import pytest
from helpers import make_corpus
from sqlalchemy import text

from kdbl_control.cli import main as cli_main
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.compact import INDEXES, compact
from kdbl_core.search import bm25_topk, lexical

FILES = {f"n{i:02}.txt": f"okapi note {i} about wombat burrows and quokka paths " * (1 + i % 4) for i in range(30)}


async def _top(api_pool, corpus) -> list[tuple[str, float]]:
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    async with rls_transaction(api_pool, principal) as conn:
        hits = await bm25_topk.search(conn, "wombat quokka", lexical.Filters(), limit=10, ts_config="english")
    return [(h.key, h.score) for h in hits]


@pytest.mark.asyncio
async def test_compact_rebuilds_the_keyword_indexes_reports_progress_and_search_answers_the_same(
        owner_engine, worker_engine, owner_url, tmp_path, unique, api_pool):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / "share", FILES, tenant=f"compact-{unique}")
    before = await _top(api_pool, corpus)
    lines: list[str] = []
    report = compact(owner_url, log=lines.append, every_s=0.001)
    assert [r["index"] for r in report] == list(INDEXES)
    assert all(r["bytes_before"] > 0 and r["bytes_after"] > 0 and r["seconds"] >= 0 for r in report)
    assert [line for line in lines if line.startswith("compact: rebuilding")] == [
        f"compact: rebuilding {name} ({r['bytes_before'] / 2**20:,.0f} MB)" for name, r in zip(INDEXES, report)]
    with owner_engine.connect() as conn:
        valid = conn.execute(text("SELECT bool_and(indisvalid AND indisready) FROM pg_index "
                                  "WHERE indexrelid IN ('postings_pkey'::regclass, 'postings_file_idx'::regclass)"))
        assert valid.scalar() is True
    assert await _top(api_pool, corpus) == before and len(before) == 10


def test_the_compact_command_prints_what_it_rebuilt(owner_url, monkeypatch, capsys):
    monkeypatch.setenv("KDBL_DATABASE_URL", owner_url)
    with pytest.raises(SystemExit) as done:
        cli_main(["db", "compact"])
    out = capsys.readouterr()
    assert done.value.code == 0, out.err
    printed = json.loads(out.out)
    assert [r["index"] for r in printed["indexes"]] == list(INDEXES)
    assert "compact: rebuilding postings_pkey" in out.err
    # every tenant with chunks gets its keyword lists packed again (the kdbl_bm25 extension)
    packed = [t for t in printed["keyword_lists"] if "skipped" not in t]
    assert packed and all(t["lists"] > 0 and t["postings"] >= t["lists"] for t in packed)
    assert "compact: packing the keyword lists of tenant" in out.err
