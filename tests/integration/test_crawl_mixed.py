"""A mixed collection as a real share holds it crawls to the end, every file with a status and a reason
(issue 12): a novel as text, a PDF of thousands of pages, a large HTML filing, mail with an attachment,
Office documents (shipped samples in tests/data/docs), an old-encoding text, an empty file, binary junk
and an odd file name, in one crawl.
"""

from __future__ import annotations

import random
import shutil
from email.message import EmailMessage
from pathlib import Path

from helpers import db_of, make_corpus, make_pdf, pdf_text_page
from sqlalchemy import text

from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.search import bm25_topk, lexical
from kdbl_core.settings import Settings
from kdbl_worker.bench_crawl import big_text
from kdbl_worker.pipeline import Indexer, load_sources

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "docs"
PAGES = 3_000


def _filing(rows: int) -> str:
    """An HTML filing: navigation around the main text, a long table of numbers, the marker at the end."""
    body = "".join(f"<tr><td>Item {i}</td><td>{i * 37 % 1000}.{i % 100:02d}</td><td>segment {i % 7}</td></tr>"
                   for i in range(rows))
    return ("<html><head><title>Annual filing</title></head><body><nav>Home | Filings | Contact</nav>"
            "<main><h1>Annual report</h1><p>Revenue grew in every segment.</p>"
            f"<table>{body}</table><p>The auditor signed the accounts of obsidianfjord holdings.</p></main>"
            "<footer>Copyright</footer></body></html>")


def _utf16_mail() -> bytes:
    """A message a Windows tool saved whole as UTF-16 (BOM and all)."""
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "it@example.org", "team@example.org", "Migration"
    msg.set_content("Die Migration des larkspur Servers ist für Größere Änderungen geplant.\n")
    return msg.as_string().encode("utf-16")


def _mail() -> bytes:
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "ops@example.org", "team@example.org", "Outage review"
    msg.set_content("The outage review found the heliotrope switch at fault.\n")
    msg.add_attachment(b"%PDF-1.4 not really", maintype="application", subtype="pdf", filename="timeline.pdf")
    return bytes(msg)


async def test_a_mixed_real_world_collection_crawls_to_the_end_with_a_status_for_every_file(
        owner_engine, worker_engine, api_pool, tmp_path, unique):
    files: dict[str, str | bytes] = {
        "novel.txt": big_text(3) + "\n\nThe last word was marzipanquill.\n",
        "manual.pdf": make_pdf([pdf_text_page(f"Page {n} of the manual.") for n in range(1, PAGES)]
                               + [pdf_text_page("Last page: calibrate the quasarvane.")]),
        "filing.html": _filing(20_000),
        "mail/outage.eml": _mail(),
        "legacy/latin1.txt": "Caf\xe9 cr\xe8me br\xfbl\xe9e, a note about the tamarisk cellar.\n".encode("latin-1"),
        "legacy/utf16.txt": "Notes from the nightjar survey: Größe, Москва.\n".encode("utf-16"),
        "mail/utf16.eml": _utf16_mail(),
        # PowerShell's Out-File: UTF-16 LE with a BOM under a declaration that still says utf-8
        "data/export.xml": ('<?xml version="1.0" encoding="utf-8"?>\n<export><item>sandpiper count: 12'
                            "</item></export>\n").encode("utf-16"),
        "empty.txt": "",
        "junk.bin": random.Random(1).randbytes(50_000),
        "odd names/r\u00e9sum\u00e9 (final) #2.md": "# R\u00e9sum\u00e9\n\nWorked on the zephyrine project.\n",
    }
    office = sorted(p for p in SAMPLES.iterdir() if p.suffix in {".docx", ".pptx", ".csv"})
    assert len(office) >= 10
    corpus = make_corpus(owner_engine, worker_engine, tmp_path / f"mixed-{unique}", files, tenant=f"mix-{unique}")
    # the shipped Office samples join the share and a second crawl picks them up with the rest unchanged
    (corpus.root / "office").mkdir()
    for sample in office:
        shutil.copy(sample, corpus.root / "office" / sample.name)
    [source] = load_sources(db_of(worker_engine), source_id=corpus.source_id)
    stats = Indexer(db_of(worker_engine), Settings()).crawl(source)
    assert stats.indexed == len(office) and stats.unchanged == len(files)

    with owner_engine.connect() as conn:
        rows = {r.key: r for r in conn.execute(text(
            "SELECT key, status, status_reason, chunk_count, parent_id, "
            "(SELECT max(page_no) FROM chunks c WHERE c.file_id = f.id) AS last_page "
            "FROM files f WHERE f.source_id = :s"), {"s": corpus.source_id})}
    listed = {k for k, r in rows.items() if r.parent_id is None}
    assert listed == set(files) | {f"office/{p.name}" for p in office}
    assert rows["mail/outage.eml!/attachments/timeline.pdf"].parent_id is not None  # attachments are members
    for key, row in rows.items():
        assert row.status in {"ok", "partial", "failed", "skipped"}, key
        assert row.status == "ok" or row.status_reason, (key, row.status)
    assert rows["manual.pdf"].status == "ok" and rows["manual.pdf"].last_page == PAGES
    assert rows["empty.txt"].status == "skipped" and rows["junk.bin"].status == "skipped"
    assert {k: (rows[k].status, rows[k].status_reason) for k in ("novel.txt", "filing.html", "mail/outage.eml")
            if rows[k].status != "ok" or rows[k].chunk_count == 0} == {}
    # not UTF-8: decoded in the encoding found, which the reason names (extract/encoding.py)
    assert {k: (rows[k].status, rows[k].status_reason) for k in (
        "legacy/latin1.txt", "legacy/utf16.txt", "mail/utf16.eml", "data/export.xml")} == {
        "legacy/latin1.txt": ("ok", "encoding: windows-1252 (detected)"),
        "legacy/utf16.txt": ("ok", "encoding: utf-16-le (BOM)"),
        "mail/utf16.eml": ("ok", "encoding: utf-16-le (BOM)"),
        "data/export.xml": ("ok", "encoding: utf-16-le (BOM)")}
    assert sum(rows[f"office/{p.name}"].status in {"ok", "partial"} for p in office) >= len(office) - 2

    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:t")
    found = {}
    async with rls_transaction(api_pool, principal) as conn:
        for word in ("quasarvane", "obsidianfjord", "heliotrope", "tamarisk", "zephyrine", "marzipanquill",
                     "nightjar", "larkspur", "sandpiper"):
            hits = await bm25_topk.search(conn, word, lexical.Filters(), limit=3, ts_config="english")
            found[word] = [h.key for h in hits]
    assert found == {"quasarvane": ["manual.pdf"], "obsidianfjord": ["filing.html"],
                     "heliotrope": ["mail/outage.eml"], "tamarisk": ["legacy/latin1.txt"],
                     "zephyrine": ["odd names/r\u00e9sum\u00e9 (final) #2.md"], "marzipanquill": ["novel.txt"],
                     "nightjar": ["legacy/utf16.txt"], "larkspur": ["mail/utf16.eml"],
                     "sandpiper": ["data/export.xml"]}
