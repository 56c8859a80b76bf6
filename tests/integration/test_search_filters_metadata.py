"""search_content's list filters over MCP (official SDK client): `source_ids`, several `content_types`,
`authors` (case-insensitive whole names) and `labels` (a source's config labels and label_globs, a
Markdown file's front matter tags), each applied in both arms before the top-N; get_file_metadata shows
a file's authors and labels (issue 16). The files are generated here and crawled by the real worker."""

from __future__ import annotations

import uuid
from email.message import EmailMessage

import jsonschema
import pytest
from helpers import Corpus, crawl, db_of, make_pdf, mcp_client, pdf_text_page, running_api
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending


def _mail() -> bytes:
    message = EmailMessage()
    message["From"] = "Ops Team <ops@example.org>"
    message["Subject"] = "Heron sighting"
    message.set_content("A grey heron was sighted by the reservoir this morning.")
    return message.as_bytes()


FILES_A = {
    "reports/q1.pdf": make_pdf([pdf_text_page("Heron budget ledger for the first quarter")],
                               info=b"/Author (Jane Doe)"),
    "notes.md": "---\ntags: [pond, birds]\n---\n# Nests\nThe heron nests by the pond every spring.\n",
    "mail.eml": _mail(),
    "page.html": ('<html><head><meta name="author" content="Beatrix Potter"></head>'
                  "<body><p>A drawing of a heron standing in the reeds.</p></body></html>"),
}
FILES_B = {"other.md": "A heron fishing in the second source's river.\n"}
FILES_C = {"egret.html": ('<html><head><meta name="author" content="ÉMILE Zola"></head>'
                          "<body><p>An egret wading in the shallows.</p></body></html>")}


def _source(owner_engine, worker_engine, root, files, tenant, config, *, hybrid: bool = True) -> Corpus:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())
    t = admin.create_tenant(db_of(owner_engine), tenant, exist_ok=True)
    s = admin.add_source(db_of(owner_engine), tenant, protocol="fs", config={"root": str(root), **config},
                         name=root.name, hybrid=hybrid)
    corpus = Corpus(tenant, t.id, s.id, root)
    crawl(worker_engine, corpus)
    return corpus


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    name = f"filters-{uuid.uuid4().hex[:10]}"
    base = tmp_path_factory.mktemp("filters")
    a = _source(owner_engine, worker_engine, base / "a", FILES_A, name,
                {"labels": ["finance"], "label_globs": {"reports/": ["report"]}})
    b = _source(owner_engine, worker_engine, base / "b", FILES_B, name, {})
    c = _source(owner_engine, worker_engine, base / "c", FILES_C, name, {}, hybrid=False)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=a.tenant_id, batch=16) > 0
    token = admin.create_token(db_of(owner_engine), tenant_name=name, name="agent")[0]
    settings = Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, "token": token, "a": str(a.source_id), "b": str(b.source_id), "c": str(c.source_id)}


mcp = mcp_client


async def call(world, tool: str, **args) -> dict:
    async with mcp(world["url"], world["token"]) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}[tool].output_schema
        structured = (await client.call_tool(tool, args)).structured_content
    jsonschema.validate(structured, schema)
    return structured


async def keys(world, **args) -> set[str]:
    result = await call(world, "search_content", query="heron", limit=20, **args)
    assert result["degraded"] is False, result["degraded_reason"]
    return {h["key"] for h in result["hits"]}


async def test_get_file_metadata_shows_each_files_authors_and_labels(world):
    pdf = await call(world, "get_file_metadata", source_id=world["a"], key="reports/q1.pdf")
    notes = await call(world, "get_file_metadata", source_id=world["a"], key="notes.md")
    mail = await call(world, "get_file_metadata", source_id=world["a"], key="mail.eml")
    other = await call(world, "get_file_metadata", source_id=world["b"], key="other.md")
    assert (pdf["authors"], pdf["labels"]) == (["Jane Doe"], ["finance", "report"])
    assert (notes["authors"], notes["labels"]) == ([], ["finance", "pond", "birds"])
    assert (mail["authors"], mail["labels"]) == (["Ops Team", "ops@example.org"], ["finance"])
    assert (other["authors"], other["labels"]) == ([], [])


@pytest.mark.parametrize("mode", ["lexical", "semantic", "hybrid"])
async def test_each_list_filter_narrows_every_arm_to_its_files(world, mode):
    everything = await keys(world, mode=mode)
    assert everything == set(FILES_A) | set(FILES_B)
    assert await keys(world, mode=mode, authors=["JANE DOE", "nobody"]) == {"reports/q1.pdf"}
    assert await keys(world, mode=mode, authors=["ops@example.org"]) == {"mail.eml"}
    assert await keys(world, mode=mode, authors=["Jane"]) == set()  # whole names only
    assert await keys(world, mode=mode, labels=["pond", "report"]) == {"notes.md", "reports/q1.pdf"}
    assert await keys(world, mode=mode, labels=["finance"]) == set(FILES_A)
    assert await keys(world, mode=mode, labels=["Finance"]) == set()  # labels match exactly
    assert await keys(world, mode=mode, content_types=["application/pdf", "text/html"]) == {
        "reports/q1.pdf", "page.html"}
    assert await keys(world, mode=mode, source_ids=[world["b"]]) == set(FILES_B)
    assert await keys(world, mode=mode, source_ids=[world["a"], world["b"]]) == everything
    assert await keys(world, mode=mode, source_id=world["a"], labels=["birds"]) == {"notes.md"}


@pytest.mark.parametrize("mode", ["lexical", "semantic"])
async def test_filters_apply_before_the_top_n_so_one_hit_is_the_filtered_file(world, mode):
    result = await call(world, "search_content", query="heron", limit=1, mode=mode, authors=["beatrix potter"])
    assert [h["key"] for h in result["hits"]] == ["page.html"]


async def test_an_unknown_source_in_source_ids_is_refused_like_an_unknown_source_id(world):
    unknown = str(uuid.uuid4())
    async with mcp(world["url"], world["token"]) as client:
        with pytest.raises(MCPError) as listed:
            await client.call_tool("search_content", {"query": "heron", "mode": "lexical",
                                                      "source_ids": [world["a"], unknown]})
        with pytest.raises(MCPError) as empty:
            await client.call_tool("search_content", {"query": "heron", "authors": []})
    assert listed.value.code == -32602 and "source_ids" in listed.value.message
    assert unknown not in listed.value.message  # the same answer for a missing and a hidden source
    assert empty.value.code == -32602 and "authors" in empty.value.message


async def test_the_single_source_id_and_content_type_filters_keep_working_beside_the_lists(world):
    single = await call(world, "search_content", query="heron", mode="lexical", source_id=world["a"],
                        content_type="text/*")
    assert {h["key"] for h in single["hits"]} == {"notes.md", "page.html"}


async def test_source_ids_that_all_have_hybrid_off_degrade_to_lexical_and_a_mix_does_not(world):
    off = await call(world, "search_content", query="egret", mode="semantic", source_ids=[world["c"]])
    mixed = await call(world, "search_content", query="egret", mode="semantic", source_ids=[world["a"], world["c"]])
    assert (off["mode"], off["degraded_reason"]) == ("lexical", "hybrid is disabled for these sources")
    assert [h["key"] for h in off["hits"]] == ["egret.html"]
    assert mixed["mode"] == "semantic" and mixed["degraded"] is False


async def test_authors_compare_ignoring_case_beyond_ascii(world):
    result = await call(world, "search_content", query="egret", mode="lexical", authors=["émile zola"])
    assert [h["key"] for h in result["hits"]] == ["egret.html"]
