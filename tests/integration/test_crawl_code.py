"""Crawling a small source tree: code is searchable by identifier, each file's status names its language."""

from __future__ import annotations

import random

from helpers import make_corpus
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical

TREE: dict[str, str | bytes] = {
    "app/ledger.py": (
        "import decimal\n\n\n"
        "class Ledger:\n"
        "    def reconcile_quillback_balance(self, entries):\n"
        "        return sum(e.amount for e in entries)\n"
    ),
    "cmd/server/main.go": "package main\n\nfunc FrobnicateGravelwort() int {\n\treturn 42\n}\n",
    "deploy/values.yaml": "replicas: 3\nteam: sprocketmoss\n",
    "docs/plans.org": "* TODO Migrate the thistlecrown cluster\n  DEADLINE: <2026-02-01>\n",
    "Dockerfile": "FROM debian:bookworm\nRUN useradd lanternfig\n",
    "tools/notes.unknownext": "Remember the wobbleberry checklist before a release.\n",
    "build/cache.bin2": random.Random(14).randbytes(20_000),
}


async def test_a_source_tree_is_searchable_by_identifier_and_each_file_says_its_language(
        owner_engine, worker_engine, api_pool, tmp_path, unique):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"code-{unique}", TREE,
                         tenant=f"code-{unique}")
    with owner_engine.connect() as conn:
        rows = {r.key: r for r in conn.execute(text(
            "SELECT key, status, status_reason, content_type FROM files WHERE source_id = :s"),
            {"s": corpus.source_id})}
        python_text = conn.execute(text(
            "SELECT string_agg(c.text, '\n' ORDER BY c.seq) FROM chunks c JOIN files f ON f.id = c.file_id "
            "WHERE f.source_id = :s AND f.key = 'app/ledger.py'"), {"s": corpus.source_id}).scalar()
    assert {k: (r.status, r.status_reason, r.content_type) for k, r in rows.items()} == {
        "app/ledger.py": ("ok", "language: Python", "text/x-python"),
        "cmd/server/main.go": ("ok", "language: Go", "text/x-go"),
        "deploy/values.yaml": ("ok", "language: YAML", "application/yaml"),
        "docs/plans.org": ("ok", "language: Org", "text/x-org"),
        "Dockerfile": ("ok", "language: Dockerfile", "text/x-dockerfile"),
        "tools/notes.unknownext": ("ok", "detected as text by content", "text/plain"),
        "build/cache.bin2": ("skipped", "unsupported format (binary content)", None),
    }
    # the indentation of a method body survives into the indexed text
    assert "    def reconcile_quillback_balance(self, entries):\n        return sum(" in python_text

    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    found = {}
    async with rls_transaction(api_pool, principal) as conn:
        for query in ("reconcile_quillback_balance", "FrobnicateGravelwort", "sprocketmoss",
                      "thistlecrown", "lanternfig", "wobbleberry"):
            hits = await bm25_topk.search(conn, query, lexical.Filters(), limit=3, ts_config="english")
            found[query] = [h.key for h in hits]
    assert found == {"reconcile_quillback_balance": ["app/ledger.py"],
                     "FrobnicateGravelwort": ["cmd/server/main.go"], "sprocketmoss": ["deploy/values.yaml"],
                     "thistlecrown": ["docs/plans.org"],
                     "lanternfig": ["Dockerfile"], "wobbleberry": ["tools/notes.unknownext"]}
