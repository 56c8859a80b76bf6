"""Per-hit context_header and token_count through the official MCP client: a Markdown, an HTML, a DOCX
and a PDF (with an outline) file, crawled for real, give hits whose context_header is the heading path
above the matched chunk (response_mode preview), and whose token_count (metadata and up) is the chunk
text's count by the embedding model's tokenizer when the worker has the model, the estimate when not,
and null for a chunk indexed before either existed. The default hit shape does not change but for
`duplicates`, present only on a hit whose text other chunks repeat (the Markdown, HTML and DOCX files
give some identical chunks: one hit lists the others)."""

from __future__ import annotations

import io
import uuid
import zipfile
from contextlib import asynccontextmanager

import heading_samples as samples
import jsonschema
import pytest
from helpers import db_of, running_api, window_chunk_texts
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from kdbl_control import admin
from kdbl_core.embedder import Tokenizer
from kdbl_core.settings import Settings
from kdbl_worker import token_counts
from kdbl_worker.pipeline import Indexer, load_sources



def _zip(members: dict[str, str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as package:
        for name, text in members.items():
            package.writestr(name, text)
    return out.getvalue()


FILES = {"manual.md": samples.markdown(), "manual.html": samples.html(), "manual.docx": samples.docx(),
         "manual.pdf": samples.manual_pdf(), "old.md": "# Archive\n\nThe legacyword note from before.",
         "bundle.zip": _zip({"inner.md": "# Packed\n\n## Inside\n\nThe zipword member text."})}
# The reference's hit (../shared/seeds/000) plus the kdbl:// uri it has always carried
CLASSIC = {"source_id", "key", "seq", "uri", "text", "truncated", "snippet", "page_no", "char_start", "char_end",
           "ts_start_ms", "ts_end_ms", "url", "rank"}


def _source(owner_engine, worker_engine, tenant: str, root, settings: Settings) -> str:
    root.mkdir(parents=True)
    for name, body in FILES.items():
        (root / name).write_bytes(body if isinstance(body, bytes) else body.encode())
    source = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root)}, name=root.name)
    [row] = load_sources(db_of(worker_engine), source_id=source.id)
    Indexer(db_of(worker_engine), settings).crawl(row)
    return str(source.id)


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embed_model_path):
    tenant = f"headers-{uuid.uuid4().hex[:10]}"
    admin.create_tenant(db_of(owner_engine), tenant)
    base = tmp_path_factory.mktemp("headers")
    modelled = _source(owner_engine, worker_engine, tenant, base / "modelled",
                       Settings(embed_model_path=str(embed_model_path)))
    estimated = _source(owner_engine, worker_engine, tenant, base / "estimated", Settings())
    with db_of(owner_engine).connection() as conn:  # old.md as indexed before migration 0015
        conn.execute("UPDATE chunks SET context_header = NULL, text_tokens = NULL WHERE file_id IN "
                     "(SELECT id FROM files WHERE key = 'old.md' AND source_id = ANY(%(s)s::uuid[]))",
                     {"s": [modelled, estimated]})
    token = admin.create_token(db_of(owner_engine), tenant_name=tenant, name="agent")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        yield {"url": url, "token": token, "modelled": modelled, "estimated": estimated}


@asynccontextmanager
async def mcp(world):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {world['token']}"})
    async with http, Client(streamable_http_client(f"{world['url']}/mcp", http_client=http)) as client:
        yield client


async def search(world, query: str, source: str, **args) -> list[dict]:
    async with mcp(world) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
        result = (await client.call_tool("search_content", {"query": query, "source_id": world[source],
                                                            "mode": "lexical", "limit": 20, **args})).structured_content
    jsonschema.validate(result, schema)
    return result["hits"]


async def chunk_text(world, source: str, key: str, seq: int) -> str:
    async with mcp(world) as client:
        window = (await client.call_tool("get_file_window", {"source_id": world[source], "key": key, "start": seq,
                                                             "length": 1})).structured_content
    return window_chunk_texts(window)[0]


def places(hits: list[dict]) -> list[tuple[str, int]]:
    """Every (key, seq) the hits stand for: their own and their copies'."""
    return [(h["key"], h["seq"]) for h in hits] + [(d["key"], d["seq"]) for h in hits for d in h["duplicates"]]


@pytest.mark.parametrize("word", sorted(samples.WORDS))
async def test_each_format_gives_hits_whose_context_header_is_the_heading_path_above_the_chunk(world, word):
    hits = await search(world, word, "modelled", response_mode="preview")
    assert {key for key, _ in places(hits)} == {"manual.md", "manual.html", "manual.docx", "manual.pdf"}
    assert len(places(hits)) == len(set(places(hits)))  # a copy is listed once, never also as a hit
    assert {h["context_header"] for h in hits} == {" > ".join(samples.WORDS[word])}


async def test_token_count_is_the_model_tokenizers_count_of_the_chunk_text(world, embed_model_path):
    tokenizer = Tokenizer(embed_model_path)
    try:
        hits = await search(world, "brushes", "modelled", response_mode="metadata")
        assert len(places(hits)) >= 4
        for hit in hits:
            text = await chunk_text(world, "modelled", hit["key"], hit["seq"])
            assert hit["token_count"] == tokenizer.count(text) > 0
    finally:
        tokenizer.close()


async def test_token_count_is_the_estimate_when_the_worker_has_no_model(world):
    hits = await search(world, "moltensalt", "estimated", response_mode="metadata")
    assert len(places(hits)) >= 4
    for hit in hits:
        text = await chunk_text(world, "estimated", hit["key"], hit["seq"])
        assert hit["token_count"] == token_counts.estimate(text) > 0


async def test_an_archive_members_chunks_carry_their_heading_path_and_token_count(world, embed_model_path):
    [hit] = await search(world, "zipword", "modelled", response_mode="preview")
    assert hit["key"] == "bundle.zip!/inner.md" and hit["context_header"] == "Packed > Inside"
    tokenizer = Tokenizer(embed_model_path)
    try:
        assert hit["token_count"] == tokenizer.count(await chunk_text(world, "modelled", hit["key"], hit["seq"]))
    finally:
        tokenizer.close()


async def test_chunks_indexed_before_headers_and_token_counts_have_null_ones(world):
    [hit] = await search(world, "legacyword", "modelled", response_mode="preview")
    assert hit["key"] == "old.md" and hit["context_header"] is None and hit["token_count"] is None


async def test_the_modes_offer_token_count_from_metadata_and_context_header_from_preview(world):
    ids = await search(world, "azimuth", "modelled", response_mode="ids_only")
    metadata = await search(world, "azimuth", "modelled", response_mode="metadata")
    picked = await search(world, "azimuth", "modelled", response_mode="preview", fields=["context_header"])
    assert ids and all("token_count" not in h and "context_header" not in h for h in ids)
    assert all(h["token_count"] > 0 and "context_header" not in h for h in metadata)
    assert {h["context_header"] for h in picked} == {"Solar plant manual > Heliostats"}
    assert all(list(h) == ["context_header"] for h in picked)


async def test_the_default_hit_keeps_the_reference_shape(world):
    hits = await search(world, "azimuth", "modelled")
    assert hits and all(set(h) - {"duplicates"} == CLASSIC for h in hits)
    copied = [h for h in hits if "duplicates" in h]
    assert copied, "copies of a chunk in the Markdown, HTML and DOCX files collapse into one hit"
    for hit in copied:
        assert hit["duplicates"] and all(set(d) == {"source_id", "key", "uri", "seq", "page_no"}
                                         for d in hit["duplicates"])
        assert {hit["key"]} | {d["key"] for d in hit["duplicates"]} <= {"manual.md", "manual.html", "manual.docx"}
