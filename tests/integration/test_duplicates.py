"""Near-duplicate collapse (kdbl_core.search.duplicates): one hit per text in every mode, the other
copies listed on it, and still the best `limit` distinct texts (the arms fetch deeper for them)."""

from __future__ import annotations

import uuid

import jsonschema
import pytest
from helpers import db_of, make_corpus, mcp_client, running_api

from kdbl_control import admin
from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
from kdbl_core.search import bm25_topk, pipeline
from kdbl_core.search.lexical import Filters
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

PAPER = ("Heliostat mirrors drift out of calibration as their mounts settle; the survey measured the drift of "
         "each heliostat against the tower's reference target every quarter and corrected the tracking "
         "offsets, which kept the concentrated beam within the receiver aperture. ")
# ~1,000 characters a paragraph: each is a chunk of its own (two exceed the 1,200-character target)
REPEATED = ("Before any maintenance on the receiver the beam is parked off the tower and the heliostat field is "
            "stowed; the operator confirms the stow on the control panel and tags the isolator. ") * 5
OTHER = ("Inspection logs record the corrosion of the support frames, the state of the drive motors and the "
         "cleaning schedule of the mirror surfaces for every row of the field. ") * 6
N_COPIES = 12


def _files() -> dict[str, str]:
    files = {f"copies/paper-{i:02d}.md": PAPER * 2 for i in range(N_COPIES)}
    files["copies/paper-spaced.md"] = (PAPER * 2).replace(" ", "  ").replace("; ", ";\n")  # the same text, respaced
    files["copies/paper-shouting.md"] = (PAPER * 2).upper()  # and in capitals
    # twelve other texts, each on heliostat calibration to a different degree
    for i in range(12):
        files[f"notes/note-{i:02d}.md"] = (f"Note {i}: the heliostat calibration " + "survey " * (i % 4)
                                           + f"of row {i} found mirrors aligned; wind load {i * 7} pascal. ")
    files["manual.md"] = "\n\n".join([OTHER, REPEATED, OTHER.replace("frames", "posts"), REPEATED,
                                      OTHER.replace("frames", "rails"), REPEATED])
    return files


@pytest.fixture(scope="module")
def corpus(owner_engine, worker_engine, tmp_path_factory, embedder):
    made = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("dups") / "kb", _files(),
                       tenant=f"dups-{uuid.uuid4().hex[:8]}")
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=made.tenant_id, batch=32) > 0
    return made


async def _search(api_pool, corpus, embedder, query: str, mode: str, limit: int, **settings):
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:dups",
                          scopes=frozenset(ALL_SCOPES))
    async with rls_transaction(api_pool, principal) as conn:
        return await SearchPlan(pipeline.SearchRequest(query=query, mode=mode, limit=limit),
                                settings=Settings(**settings), embedder=embedder).run(conn)


def _texts(hits) -> list[str]:
    return [" ".join(h["text"].lower().split()) for h in hits]


@pytest.mark.parametrize("mode", ["lexical", "hybrid", "semantic"])
async def test_copies_of_one_text_across_files_appear_once_with_the_other_locations_listed(api_pool, corpus,
                                                                                            embedder, mode):
    result = await _search(api_pool, corpus, embedder, "heliostat drift calibration survey", mode, 10)
    assert result.mode == mode
    # byte copies fold in every mode; with BM25 scores (lexical, hybrid) the respaced and the capitalised
    # copy too (semantic has no scores to find them by, and they embed differently anyway)
    copies = {k for k in _files() if k.startswith("copies/paper-") and k[-5:-3].isdigit()}
    if mode != "semantic":
        copies |= {"copies/paper-spaced.md", "copies/paper-shouting.md"}
    papers = [h for h in result.hits if h["key"] in copies]
    assert len(papers) == 1, [h["key"] for h in result.hits]
    # every copy is named once: as the hit or in its `duplicates`
    assert {d["key"] for d in papers[0]["duplicates"]} | {papers[0]["key"]} == copies
    first = papers[0]["duplicates"][0]
    assert set(first) == {"source_id", "key", "uri", "seq", "page_no"} and first["uri"].startswith("kdbl://file/")
    assert len(set(_texts(result.hits))) == len(result.hits) or mode == "semantic"


async def test_a_passage_a_file_repeats_is_one_hit_with_its_other_places(api_pool, corpus, embedder):
    result = await _search(api_pool, corpus, embedder, "receiver maintenance beam parked stowed isolator",
                           "lexical", 5)
    manual = [h for h in result.hits if h["key"] == "manual.md"]
    assert len([h for h in manual if "isolator" in h["snippet"]]) == 1
    top = result.hits[0]
    assert top["key"] == "manual.md"
    assert sorted(d["seq"] for d in top["duplicates"]) == sorted({1, 3, 5} - {top["seq"]})


async def test_lexical_still_returns_the_best_k_distinct_texts_fetching_deeper_past_the_copies(api_pool, corpus,
                                                                                               embedder):
    query = "heliostat drift calibration survey"
    result = await _search(api_pool, corpus, embedder, query, "lexical", 8)
    # the reference: the exact BM25 ranking, deep, with each text kept at its first place
    async with rls_transaction(api_pool, Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant,
                                                   subject="user:dups", scopes=frozenset(ALL_SCOPES))) as conn:
        ranked = await bm25_topk.search(conn, query, Filters(), limit=200, ts_config="english")
        texts = dict((r.chunk_id, r) for r in ranked)
        rows = await (await conn.execute("SELECT id, text FROM chunks WHERE id = ANY(%(ids)s)",
                                         {"ids": list(texts)})).fetchall()
    by_id = {r.id: " ".join(r.text.lower().split()) for r in rows}
    seen, best = set(), []
    for hit in ranked:
        if by_id[hit.chunk_id] not in seen:
            seen.add(by_id[hit.chunk_id])
            best.append((hit.key, hit.seq))
    # 14 copies of the paper lead the raw ranking: without fetching deeper a page of 8 would hold 1 hit
    assert [(h.key.split("/")[0]) for h in ranked[:N_COPIES + 2]] == ["copies"] * (N_COPIES + 2)
    assert [(h["key"], h["seq"]) for h in result.hits] == best[:8]
    assert result.has_more and len(result.hits) == 8


async def test_a_search_without_copies_reads_no_text_keys(api_pool, corpus, embedder):
    # distinct BM25 scores: no chunk ties another, so no statement hashes any text
    result = await _search(api_pool, corpus, embedder, "wind load 77 pascal", "lexical", 3)
    assert result.hits[0]["key"] == "notes/note-11.md" and "duplicates" not in result.hits[0]


async def test_the_duplicates_field_is_in_search_contents_output_schema(owner_engine, owner_url, corpus):
    token = admin.create_token(db_of(owner_engine), tenant_name=corpus.tenant, name="d")[0]
    with running_api(owner_url, Settings(mcp_enabled=True)) as url:
        async with mcp_client(url, token) as client:
            schema = {t.name: t for t in (await client.list_tools()).tools}["search_content"].output_schema
            structured = (await client.call_tool("search_content", {"query": "heliostat drift survey",
                                                                    "mode": "lexical"})).structured_content
    jsonschema.validate(structured, schema)
    hit = next(h for h in structured["hits"] if h.get("duplicates"))
    assert len(hit["duplicates"]) == N_COPIES + 1
    assert "duplicates" in schema["$defs"]["Hit"]["properties"]
