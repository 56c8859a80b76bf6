"""find_similar over MCP (official SDK client): more like this for a text, a chunk or a file, by chunks or
by files, the subject left out; the stored embeddings where the tenant may use them, a lexical
more-like-this otherwise (saying which and why); nothing hidden ever found or confirmed (issue 17)."""

from __future__ import annotations

import uuid

import httpx
import jsonschema
import pytest
from helpers import Corpus, crawl, db_of, mcp_client, running_api
from mcp.shared.exceptions import MCPError

from kdbl_control import admin
from kdbl_core.content.uris import chunk_id, file_uri
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

TOPICS = {
    "volcano": ["Magma rises through the volcano's vent and erupts as lava and ash.",
                "The eruption of the volcano buried the valley in ash; lava flows cooled into basalt.",
                "Geologists monitor volcano tremors, magma chambers and lava domes before an eruption."],
    "baking": ["Knead the bread dough, let the yeast rise, then bake the loaf in a hot oven.",
               "Sourdough bread needs a starter; the dough proofs overnight before baking.",
               "An oven thermometer keeps the bread crust golden; flour, water, yeast and salt make dough."],
    "sailing": ["Trim the mainsail and the jib as the wind shifts; the sailboat heels on a reach.",
                "Sailors reef the mainsail in strong wind and tack the boat upwind."],
}
FILES = {f"{topic}/{i}.txt": text for topic, texts in TOPICS.items() for i, text in enumerate(texts)}


def _write(root, files) -> None:
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body + "\n")


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory, embedder, embed_model_path):
    db = db_of(owner_engine)
    base = tmp_path_factory.mktemp("similar")
    names = {k: f"fs-{k}-{uuid.uuid4().hex[:8]}" for k in ("main", "lex", "other")}
    sources, tenants = {}, {}
    for key, hybrid in (("main", True), ("lex", True), ("other", True)):
        _write(base / key, FILES if key != "other" else {"volcano/theirs.txt": TOPICS["volcano"][0]})
        t = admin.create_tenant(db, names[key])
        s = admin.add_source(db, names[key], protocol="fs", config={"root": str(base / key)}, name=key, hybrid=hybrid)
        crawl(worker_engine, Corpus(names[key], t.id, s.id, base / key))
        assert embed_pending(db_of(worker_engine), embedder, tenant_id=t.id, batch=16) > 0
        sources[key], tenants[key] = s.id, t.id
    # restricted: alice sees one volcano file of it, not the other
    _write(base / "r", {"volcano/open.txt": TOPICS["volcano"][1], "volcano/hidden.txt": TOPICS["volcano"][2]})
    r = admin.add_source(db, names["main"], protocol="fs", config={"root": str(base / "r")}, name="r",
                         restricted=True)
    crawl(worker_engine, Corpus(names["main"], tenants["main"], r.id, base / "r"))
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=tenants["main"], batch=16) == 2
    admin.add_grant(db, source_id=r.id, subject="user:alice", file_key="volcano/open.txt")
    admin.update_tenant(db, names["main"], tools="search_content,find_similar", force=True)
    admin.update_tenant(db, names["lex"], tools="find_similar", modes="lexical", force=True)
    admin.update_tenant(db, names["other"], tools="find_similar", force=True)
    tokens = {k: admin.create_token(db, tenant_name=n, name="t", subject="user:alice")[0] for k, n in names.items()}
    settings = Settings(mcp_enabled=True, embed_model_path=str(embed_model_path))
    with running_api(owner_url, settings) as url:
        yield {"url": url, "tokens": tokens, "sources": sources, "r": r.id}


def mcp(world, who: str):
    return mcp_client(world["url"], world["tokens"][who])


async def similar(world, who: str = "main", **args) -> dict:
    async with mcp(world, who) as client:
        schema = {t.name: t for t in (await client.list_tools()).tools}["find_similar"].output_schema
        result = await client.call_tool("find_similar", args)
    jsonschema.validate(result.structured_content, schema)
    return result.structured_content


def _topics(result) -> list[str]:
    return [h["key"].split("/")[0] for h in result["hits"]]


async def test_a_file_finds_the_other_files_of_its_topic_by_its_stored_vectors_never_itself(world):
    subject = file_uri(world["sources"]["main"], "volcano/0.txt")
    result = await similar(world, subject={"kind": "file", "id": subject}, by="files", limit=3,
                           source_id=str(world["sources"]["main"]))
    assert result["method"] == "vector" and result["method_reason"] is None and result["terms"] == []
    keys = [h["key"] for h in result["hits"]]
    assert "volcano/0.txt" not in keys
    assert set(keys[:2]) == {"volcano/1.txt", "volcano/2.txt"}
    assert [h["rank"] for h in result["hits"]] == [1, 2, 3]


async def test_a_chunk_subject_is_left_out_and_by_files_leaves_out_its_file(world):
    subject = chunk_id(world["sources"]["main"], "baking/1.txt", 0)
    chunks = await similar(world, subject={"kind": "chunk", "id": subject}, limit=5)
    files = await similar(world, subject={"kind": "chunk", "id": "kdbl://chunk/" + subject}, by="files", limit=5)
    assert subject not in [h["chunk_id"] for h in chunks["hits"]]
    assert _topics(chunks)[:2] == ["baking", "baking"]
    assert "baking/1.txt" not in [h["key"] for h in files["hits"]] and _topics(files)[0] == "baking"


async def test_a_text_subject_is_embedded_and_filters_apply(world):
    text = {"kind": "text", "text": "wind in the sails of a boat"}
    result = await similar(world, subject=text, limit=2)
    assert result["method"] == "vector" and _topics(result) == ["sailing", "sailing"]
    only_baking = await similar(world, subject=text, limit=2, path="baking/")
    assert _topics(only_baking) == ["baking", "baking"]


async def test_a_lexical_only_tenant_gets_more_like_this_over_distinctive_terms_and_is_told_why(world):
    subject = file_uri(world["sources"]["lex"], "volcano/0.txt")
    result = await similar(world, "lex", subject={"kind": "file", "id": subject}, by="files", limit=2)
    assert result["method"] == "lexical" and "lexical only" in result["method_reason"]
    assert {"lava", "ash", "erupt"} & set(result["terms"])  # stems of the subject's own words
    assert _topics(result) == ["volcano", "volcano"]
    assert "volcano/0.txt" not in [h["key"] for h in result["hits"]]


async def test_nothing_hidden_is_found_or_confirmed_across_tenants_and_per_file_grants(world):
    subject = {"kind": "text", "text": TOPICS["volcano"][2]}
    found = await similar(world, subject=subject, by="files", limit=20)
    keys = {(h["source_id"], h["key"]) for h in found["hits"]}
    assert (str(world["r"]), "volcano/open.txt") in keys
    assert (str(world["r"]), "volcano/hidden.txt") not in keys
    assert all(h["source_id"] != str(world["sources"]["other"]) for h in found["hits"])
    refusals = []
    async with mcp(world, "main") as client:
        for hidden in (file_uri(world["r"], "volcano/hidden.txt"), file_uri(world["sources"]["other"], "volcano/theirs.txt"),
                       file_uri(world["r"], "volcano/missing.txt"), file_uri(uuid.uuid4(), "x.txt")):
            with pytest.raises(MCPError) as refused:
                await client.call_tool("find_similar", {"subject": {"kind": "file", "id": hidden}})
            refusals.append((refused.value.code, refused.value.message))
    assert len(set(refusals)) == 1 and refusals[0][0] == -32602 and "subject.id" in refusals[0][1]


@pytest.mark.parametrize(("args", "field"), [
    ({"subject": {"kind": "text"}}, "subject.text"),
    ({"subject": {"kind": "text", "text": "   "}}, "subject.text"),
    ({"subject": {"kind": "chunk"}}, "subject.id"),
    ({"subject": {"kind": "file", "id": "not-a-uri"}}, "subject.id"),
    ({"subject": {"kind": "chunk", "id": "kdbl://file/" + str(uuid.uuid4()) + "/a"}}, "subject.id"),
    ({"subject": {"kind": "picture", "id": "x"}}, "subject"),
    ({"subject": {"kind": "text", "text": "x"}, "by": "words"}, "by"),
    ({"subject": {"kind": "text", "text": "x"}, "limit": 0}, "limit"),
])
async def test_bad_subjects_and_options_are_refused_naming_the_field(world, args, field):
    async with mcp(world, "main") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("find_similar", args)
    assert refused.value.code == -32602 and field in refused.value.message
    assert refused.value.message.count("invalid argument") == 1  # one field named, not a nested message


async def test_capacity_shows_find_similar_latency_by_method_only_where_it_is_allowed(world):
    await similar(world, subject={"kind": "text", "text": "bread dough"}, limit=2)
    await similar(world, "lex", subject={"kind": "text", "text": "bread dough"}, limit=2)
    async with httpx.AsyncClient(timeout=30) as http:
        main = (await http.get(f"{world['url']}/capacity",
                               headers={"Authorization": f"Bearer {world['tokens']['main']}"})).json()
    tools = main["tools"]
    assert set(tools) == {"find_similar"}  # get_contents and answer are not on this tenant's allowlist
    assert tools["find_similar"]["vector"]["latency"]["samples"] >= 1
    assert tools["find_similar"]["lexical"]["latency"]["samples"] >= 1  # the process-wide figure
    assert main["modes"]["lexical"]["latency"]["samples"] == 0  # a lexical MLT is not a lexical search
