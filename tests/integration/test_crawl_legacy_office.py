"""Word, Excel and PowerPoint 97-2003 files through a real crawl: each is searchable by a word only it holds,
with its locator (slide number for .ppt, sheet number for .xls); a password-protected .doc, a .doc that is
really RTF and a truncated .xls end with their statuses in the same crawl.

The samples are the shipped ones in tests/data/legacy (LibreOffice-written, see its README).
"""

from __future__ import annotations

from pathlib import Path

from helpers import make_corpus
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical
from sqlalchemy import text

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy"


def _sample(name: str) -> bytes:
    return (LEGACY / name).read_bytes()


async def test_doc_xls_and_ppt_are_searchable_by_their_marker_words_with_locators(
        owner_engine, worker_engine, api_pool, tmp_path, unique):
    files = {
        "reports/heron.doc": _sample("heron.doc"),
        "reports/tides.xls": _sample("tides.xls"),
        "talks/lighthouse.ppt": _sample("lighthouse.ppt"),
        "reports/locked.doc": _sample("heron-locked.doc"),
        "reports/saved-as-rtf.doc": _sample("heron-word.rtf").replace(b"zanzibarheron", b"kestrelrtf"),
        "reports/cut.xls": _sample("tides.xls")[:3000],
    }
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"legacy-{unique}", files,
                         tenant=f"legacy-{unique}")
    with owner_engine.connect() as conn:
        rows = {r.key: r for r in conn.execute(text(
            "SELECT key, status, status_reason, content_type FROM files f WHERE f.source_id = :s"),
            {"s": corpus.source_id})}
        pages = dict(conn.execute(text(
            "SELECT c.id, c.page_no FROM chunks c JOIN files f ON f.id = c.file_id WHERE f.source_id = :s"),
            {"s": corpus.source_id}).all())
    assert {k: (r.status, r.content_type) for k, r in rows.items()} == {
        "reports/heron.doc": ("ok", "application/msword"),
        "reports/tides.xls": ("ok", "application/vnd.ms-excel"),
        "talks/lighthouse.ppt": ("ok", "application/vnd.ms-powerpoint"),
        "reports/locked.doc": ("failed", "application/msword"),
        "reports/saved-as-rtf.doc": ("ok", "application/rtf"),
        "reports/cut.xls": ("failed", "application/vnd.ms-excel"),
    }
    assert rows["reports/locked.doc"].status_reason == "encrypted/password-protected"
    assert rows["reports/saved-as-rtf.doc"].status_reason == "RTF content in a .doc file"
    assert rows["reports/cut.xls"].status_reason.startswith("corrupt OLE2 container")

    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    found = {}
    async with rls_transaction(api_pool, principal) as conn:
        for word in ("zanzibarheron", "quillonxls", "pelorusppt", "kestrelrtf", "Fresnel"):
            hits = await bm25_topk.search(conn, word, lexical.Filters(), limit=5, ts_config="english")
            found[word] = [(h.key, pages[h.chunk_id]) for h in hits]
    assert found == {
        "zanzibarheron": [("reports/heron.doc", None)],
        "quillonxls": [("reports/tides.xls", 1)],  # sheet 1
        "pelorusppt": [("talks/lighthouse.ppt", 2)],  # slide 2
        "kestrelrtf": [("reports/saved-as-rtf.doc", None)],
        "Fresnel": [("talks/lighthouse.ppt", 2)],
    }
