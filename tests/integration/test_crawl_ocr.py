"""OCR through a real crawl: a share with a scanned PDF page and a PNG becomes searchable by words that
exist only in the images, over MCP, with the page number in hits and in get_file_text; a source with
`ocr: false` leaves them unread with the reason, and turning it on re-extracts just those files.

The scans are rendered here from known text (kdbl_worker.bench_ocr.render), a few lines each.
"""

from __future__ import annotations

import io
import os

import pypdfium2 as pdfium
import pytest
from helpers import Corpus, crawl, db_of, make_corpus, make_pdf, pdf_text_page, running_api
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from PIL import Image
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.bench_ocr import render
from kdbl_worker.extract import ocr

SCANNED = "The zeppelin warranty expires in March of next year."
WHITEBOARD = "Quarterly okapi migration plan for the archive team."


def _image(words: str) -> Image.Image:
    font = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    return render(words, font=font if os.path.isfile(font) else None, dpi=200, width_in=6.0, height_in=None,
                  margin_in=0.3)[0]


def _contract_pdf() -> bytes:
    """Page 1 has a text layer; page 2 is only an image (a scan)."""
    out = io.BytesIO()
    _image(SCANNED).convert("RGB").save(out, "PDF", resolution=200.0)
    doc = pdfium.PdfDocument(make_pdf([pdf_text_page("Cover sheet of the maintenance contract")]))
    scan = pdfium.PdfDocument(out.getvalue())
    doc.import_pages(scan)
    merged = io.BytesIO()
    doc.save(merged)
    scan.close()
    doc.close()
    return merged.getvalue()


def _png(words: str) -> bytes:
    out = io.BytesIO()
    _image(words).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def share(tmp_path_factory) -> dict[str, bytes | str]:
    return {"scans/contract.pdf": _contract_pdf(), "notes/whiteboard.png": _png(WHITEBOARD),
            "readme.txt": "Nothing about airships or antelopes here."}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, share):
    corpus = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("ocr") / "share", share,
                         tenant="ocr-crawl")
    token, _ = admin.create_token(db_of(owner_engine), tenant_name="ocr-crawl", name="reader")
    with running_api(owner_url, Settings(mcp_enabled=True, rate_limit_per_minute=0)) as url:
        yield {"url": url, "corpus": corpus, "token": token}


async def call(world, tool: str, args: dict) -> dict:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {world['token']}"})
    async with http, Client(streamable_http_client(f"{world['url']}/mcp", http_client=http)) as client:
        result = await client.call_tool(tool, args)
    assert not result.is_error, result.content
    return result.structured_content


def _files(owner_engine, source_id) -> dict[str, tuple[str, str | None, int]]:
    with owner_engine.connect() as conn:
        rows = conn.execute(text("SELECT key, status, status_reason, chunk_count FROM files WHERE source_id = :s"),
                            {"s": source_id}).all()
    return {r.key: (r.status, r.status_reason, r.chunk_count) for r in rows}


async def test_a_word_only_in_a_scanned_page_is_found_with_its_page_number(world):
    hits = (await call(world, "search_content", {"query": "zeppelin warranty", "mode": "lexical"}))["hits"]
    assert [(h["key"], h["page_no"]) for h in hits] == [("scans/contract.pdf", 2)]
    assert "zeppelin warranty" in hits[0]["text"]


async def test_a_word_only_in_an_image_is_found_in_the_png(world, owner_engine):
    hits = (await call(world, "search_content", {"query": "okapi migration", "mode": "lexical"}))["hits"]
    assert [h["key"] for h in hits] == ["notes/whiteboard.png"]
    status, reason, _ = _files(owner_engine, world["corpus"].source_id)["notes/whiteboard.png"]
    assert (status, reason) == ("ok", None)


async def test_get_file_text_gives_the_scanned_page_its_number_and_character_locators(world):
    got = await call(world, "get_file_text", {"source_id": str(world["corpus"].source_id),
                                              "key": "scans/contract.pdf"})
    assert got["status"] == "ok" and got["content_type"] == "application/pdf"
    pages = {c["page_no"]: c for c in got["chunks"]}
    assert set(pages) == {1, 2}
    assert "Cover sheet" in pages[1]["text"] and "zeppelin warranty" in pages[2]["text"]
    assert pages[1]["char_end"] <= pages[2]["char_start"] < pages[2]["char_end"]


def test_a_source_with_ocr_off_leaves_images_unread_until_it_is_turned_on(owner_engine, worker_engine,
                                                                           tmp_path, share, unique):
    root = tmp_path / f"no-ocr-{unique}"
    for key, body in share.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_bytes(body if isinstance(body, bytes) else body.encode())
    tenant = f"no-ocr-{unique}"
    created = admin.create_tenant(db_of(owner_engine), tenant)
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs",
                              config={"root": str(root), "ocr": False},
                              name=root.name)
    corpus = Corpus(tenant, created.id, source.id, root)
    crawl(worker_engine, corpus)
    files = _files(owner_engine, source.id)
    assert files["notes/whiteboard.png"] == ("skipped", ocr.OFF, 0)
    status, reason, chunks = files["scans/contract.pdf"]
    assert (status, chunks) == ("partial", 1)
    assert reason == f"1 of 2 pages have no text layer (scanned?), first: page 2; {ocr.OFF}"
    assert files["readme.txt"][0] == "ok"

    with owner_engine.begin() as conn:
        conn.execute(text("UPDATE sources SET config = config || '{\"ocr\": true}' WHERE id = :s"),
                     {"s": source.id})
    assert crawl(worker_engine, corpus).indexed == 2  # the image and the scan; the text file is unchanged
    files = _files(owner_engine, source.id)
    assert files["notes/whiteboard.png"][:2] == ("ok", None)
    assert files["scans/contract.pdf"][:2] == ("ok", None)
    assert crawl(worker_engine, corpus).indexed == 0
