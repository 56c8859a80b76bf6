"""Named entities (issue 31) in a real database: the worker's background stage reads them from stored chunks
of sources with `entities: true`, and row-level security trims them to what the caller may read — an entity
named only in a hidden file does not exist for it, and every count is a count of readable mentions. A file
indexed again is read again; a source switched off loses its entities at once."""

from __future__ import annotations

import uuid

import pytest
from helpers import Corpus, crawl, db_of, entity_world, one_entity_file
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import entity_store
from kdbl_core.content.entities import canonical_key
from kdbl_core.search import entity_graph
from kdbl_worker.entity_stage import extract_pending

OPEN = {
    "news/deal.txt": "Acme Corp. acquired Initech GmbH for $4.2 billion on 12 March 2024 in New York.",
    "news/people.txt": "Dr. Maria Rossi joined ACME Corporation in Zurich; chief executive John Smith welcomed her.",
}
HIDDEN = {
    "board/secret.txt": "The board of Acme Corp. plans to buy Globex Corporation in Lisbon next year.",
    "board/granted.txt": "Umbrella Holdings plc signed with Acme Corp. in Berlin.",
}


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, tmp_path_factory):
    return entity_world(owner_engine, worker_engine, tmp_path_factory.mktemp("entities"), {**OPEN, **HIDDEN},
                        prefix="ent", grant=("user:alice", "granted.txt"))


async def _entities(api_pool, world, user: str) -> dict[tuple[str, str], int]:
    """(type, key) -> readable mentions, as `user` under row-level security."""
    principal = Principal(tenant_id=world["tenant_id"], tenant_name=world["tenant"], subject=f"user:{user}")
    async with rls_transaction(api_pool, principal) as conn:
        rows = await (await conn.execute(
            "SELECT e.type, e.key, coalesce(sum(m.n), 0) AS n FROM entities e "
            "LEFT JOIN entity_mentions m ON m.entity_id = e.id GROUP BY e.type, e.key")).fetchall()
    return {(r.type, r.key): int(r.n) for r in rows}


def test_the_stage_reads_every_file_once_and_merges_name_variants(world, owner_engine, worker_engine):
    with owner_engine.begin() as conn:
        rows = conn.execute(text("SELECT e.type, e.key, e.name, sum(m.n) AS n FROM entities e JOIN entity_mentions m "
                                 "ON m.entity_id = e.id WHERE e.tenant_id = :t GROUP BY e.id"),
                            {"t": world["tenant_id"]}).all()
        versions = conn.execute(text("SELECT count(*) FROM files WHERE tenant_id = :t AND entities_version = :v"),
                                {"t": world["tenant_id"], "v": entity_store.VERSION}).scalar()
    found = {(r.type, r.key): int(r.n) for r in rows}
    assert found[("ORG", "acme")] == 4  # "Acme Corp." (3 files) and "ACME Corporation": one entity
    assert {("PERSON", "maria rossi"), ("PERSON", "john smith"), ("PLACE", "zurich"), ("ORG", "initech"),
            ("MONEY", "$4.2 billion"), ("DATE", "12 march 2024"), ("ORG", "globex")} <= set(found)
    assert versions == 4
    assert extract_pending(db_of(worker_engine)) == 0  # nothing waits


async def test_each_principal_sees_only_the_entities_of_what_it_may_read(world, api_pool):
    alice, zed = await _entities(api_pool, world, "alice"), await _entities(api_pool, world, "zed")
    assert ("ORG", "globex") not in alice | zed  # named only in a hidden file: does not exist
    assert ("PLACE", "lisbon") not in alice | zed
    assert ("ORG", "umbrella holdings") in alice and ("ORG", "umbrella holdings") not in zed  # alice's grant
    assert alice[("ORG", "acme")] == 3 and zed[("ORG", "acme")] == 2  # counts of readable mentions only
    assert set(zed) < set(alice)


async def test_a_file_indexed_again_is_read_again(world, api_pool, worker_engine):
    path = world["root"] / "news/deal.txt"
    saved = path.read_text()
    path.write_text("Hooli Inc. opened an office in Paris in March 2025.")
    try:
        crawl(worker_engine, Corpus(world["tenant"], world["tenant_id"], world["open"], world["root"]))
        zed = await _entities(api_pool, world, "zed")
        assert ("ORG", "initech") not in zed and ("ORG", "hooli") not in zed  # old gone; new not read yet
        assert extract_pending(db_of(worker_engine)) == 1
        zed = await _entities(api_pool, world, "zed")
        assert ("ORG", "hooli") in zed and ("PLACE", "paris") in zed and zed[("ORG", "acme")] == 1
    finally:
        path.write_text(saved)
        crawl(worker_engine, Corpus(world["tenant"], world["tenant_id"], world["open"], world["root"]))
        extract_pending(db_of(worker_engine))


async def test_a_source_switched_off_loses_its_entities_at_once(world, api_pool, owner_engine, worker_engine):
    db = db_of(owner_engine)
    done = admin.set_source_entities(db, world["closed"], False)
    assert done["entities"] is False
    try:
        alice = await _entities(api_pool, world, "alice")
        assert ("ORG", "umbrella holdings") not in alice and alice[("ORG", "acme")] == 2  # hidden at once
        extract_pending(db_of(worker_engine))
        with owner_engine.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM entity_mentions WHERE source_id = :s"),
                                {"s": world["closed"]}).scalar() == 0
    finally:
        again = admin.set_source_entities(db, world["closed"], True)
        assert again["files_to_read"] == 2
        assert extract_pending(db_of(worker_engine)) == 2
    assert ("ORG", "umbrella holdings") in await _entities(api_pool, world, "alice")


# -- find_entity through the official MCP client --------------------------------------------------------------

async def test_find_entity_through_mcp_in_each_response_mode_and_trimmed_per_token(world, owner_engine, owner_url):
    from helpers import mcp_client, running_api

    from mcp.shared.exceptions import MCPError

    db = db_of(owner_engine)
    admin.update_tenant(db, world["tenant"], tools="search_content,find_entity", force=True)
    tokens = {user: admin.create_token(db, tenant_name=world["tenant"], name=f"e-{user}", subject=f"user:{user}")[0]
              for user in ("alice", "zed")}
    with running_api(owner_url) as url:
        async with mcp_client(url, tokens["alice"]) as client:
            tool = {t.name: t for t in (await client.list_tools()).tools}["find_entity"]
            assert tool.output_schema and "statistics" in tool.output_schema["properties"]

            async def call(**arguments):
                return (await client.call_tool("find_entity", arguments)).structured_content

            meta = await call(name="ACME Corporation")  # another spelling of "Acme Corp."
            # one entity for both spellings, named by the first the worker read
            assert meta["entity"]["name"] in ("Acme Corp.", "ACME Corporation") and meta["entity"]["entity_type"] == "ORG"
            stats = meta["statistics"]
            assert (stats["mentions"], stats["chunks"], stats["files"]) == (3, 3, 3)  # the open files + her grant
            assert stats["related_from_chunks"] == stats["chunks"]  # below the sample: every chunk counted
            assert stats["entity_type_distribution"]["PERSON"] == 2
            assert stats["relationship_count"] == stats["entity_count"] + 3  # co-occurrences and three stated
            assert meta["entities"] is None and len(meta["top_chunks"]) == 3
            assert all(c["uri"].startswith("kdbl://file/") for c in meta["top_chunks"])

            ids = await call(name="acme", response_mode="ids_only")
            assert ids["entity_ids"][0] == meta["entity"]["entity_id"] and len(ids["entity_ids"]) == 1 + stats["entity_count"]
            assert ids["statistics"] is None and ids["relationship_ids"]

            preview = await call(name="Acme", response_mode="preview")
            assert len(preview["entities"]) == 5 and len(preview["relationships"]) == 5
            shared = {e["name"]: e["shared_chunks"] for e in preview["entities"]}
            assert all(n >= 1 for n in shared.values())
            edge = next(r for r in preview["relationships"] if meta["entity"]["entity_id"] in (r["source_id"], r["target_id"]))
            assert edge["relationship_type"] == "ACQUIRED"  # stated relations first, then co-occurrences
            assert all(1 <= len(r["evidence"]) <= r["weight"] for r in preview["relationships"])

            full = await call(name="Acme", response_mode="full")
            assert len(full["entities"]) == stats["entity_count"] <= 100 and len(full["relationships"]) <= 500
            names = {e["name"] for e in full["entities"]}
            assert "Umbrella Holdings plc" in names and "Globex Corporation" not in names  # hidden file's entity
            typed = {(r["source_id"], r["relationship_type"], r["target_id"]): r for r in full["relationships"]
                     if r["relationship_type"] != "CO_OCCURS"}
            ids_of = {e["name"]: e["entity_id"] for e in full["entities"]}
            acme = meta["entity"]["entity_id"]
            assert set(typed) == {(acme, "ACQUIRED", ids_of["Initech GmbH"]), (ids_of["Maria Rossi"], "WORKS_FOR", acme),
                                  (ids_of["Umbrella Holdings plc"], "PARTNERS_WITH", acme)}  # the last: her grant
            deal = typed[(acme, "ACQUIRED", ids_of["Initech GmbH"])]
            assert deal["weight"] == 1 and deal["evidence"][0]["uri"].endswith("/deal.txt")
            assert full["statistics"]["relationship_type_distribution"] == {
                "ACQUIRED": 1, "WORKS_FOR": 1, "PARTNERS_WITH": 1, "CO_OCCURS": stats["entity_count"]}
            bare = await call(name="Acme", response_mode="full", include_relationships=False)
            assert bare["relationships"] is None and bare["entities"]

            errors = []
            for name in ("Globex", "Nonexistent Widgets"):  # hidden-only and unknown: the same answer
                with pytest.raises(MCPError) as err:
                    await call(name=name)
                errors.append((err.value.code, err.value.message.replace(name, "NAME")))
            assert errors[0][0] == -32602 and errors[0][1].split(";")[0] == errors[1][1].split(";")[0]
            with pytest.raises(MCPError) as err:
                await call(name="Acm")
            assert f"did you mean: '{meta['entity']['name']}' (ORG)" in err.value.message
            with pytest.raises(MCPError) as err:
                await call(name="x" * 201)
            assert err.value.code == -32602 and "name" in err.value.message
        async with mcp_client(url, tokens["zed"]) as client:
            zed = (await client.call_tool("find_entity", {"name": "Acme Corp."})).structured_content
            assert zed["statistics"]["mentions"] == 2 and zed["statistics"]["files"] == 2  # no grant: fewer
            assert "PARTNERS_WITH" not in zed["statistics"]["relationship_type_distribution"]  # stated in a hidden file
            with pytest.raises(MCPError):
                await client.call_tool("find_entity", {"name": "Umbrella Holdings"})
    with owner_engine.begin() as conn:
        refused = conn.execute(text("SELECT count(*) FROM audit WHERE tool = 'find_entity' AND status = 'error'"
                                    " AND tenant_id = :t"), {"t": world["tenant_id"]}).scalar()
    assert refused >= 5  # every refusal audited


# -- the leak probe: every entity x every principal, on grants and on the share's own permissions -------------

async def _probe(api_pool, owner_engine, tenant_id, tenant: str, principals: dict[str, tuple[str, ...]],
                 readable: dict[str, set[str]]) -> int:
    """For each principal and each entity of the tenant: visible exactly when a file it may read names it, with
    the mentions of those files only; relations exactly those stated in readable files. The checks made."""
    with owner_engine.begin() as conn:
        truth = conn.execute(text(
            "SELECT e.type, e.key, f.key AS file, m.n FROM entities e JOIN entity_mentions m ON m.entity_id = e.id "
            "JOIN files f ON f.id = m.file_id WHERE e.tenant_id = :t"), {"t": tenant_id}).all()
        stated = conn.execute(text(
            "SELECT s.key AS subject, r.type, o.key AS object, f.key AS file FROM entity_relations r "
            "JOIN entities s ON s.id = r.subject_id JOIN entities o ON o.id = r.object_id JOIN files f ON f.id = r.file_id "
            "WHERE r.tenant_id = :t"), {"t": tenant_id}).all()
    checks = 0
    for user, groups in principals.items():
        principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject=f"user:{user}", groups=groups)
        async with rls_transaction(api_pool, principal) as conn:
            seen = {(r.type, r.key): int(r.n) for r in await (await conn.execute(
                "SELECT e.type, e.key, sum(m.n) AS n FROM entities e JOIN entity_mentions m ON m.entity_id = e.id "
                "GROUP BY e.type, e.key")).fetchall()}
            listed = {(r.type, r.key) for r in await (await conn.execute("SELECT type, key FROM entities")).fetchall()}
            relations = {(r.subject, r.type, r.object) for r in await (await conn.execute(
                "SELECT s.key AS subject, r.type, o.key AS object FROM entity_relations r "
                "JOIN entities s ON s.id = r.subject_id JOIN entities o ON o.id = r.object_id")).fetchall()}
        want: dict[tuple[str, str], int] = {}
        for row in truth:
            if row.file in readable[user]:
                want[(row.type, row.key)] = want.get((row.type, row.key), 0) + row.n
        assert seen == want and listed == set(want), user
        assert relations == {(r.subject, r.type, r.object) for r in stated if r.file in readable[user]}, user
        checks += len({(r.type, r.key) for r in truth}) + len(stated)
    return checks


async def test_the_leak_probe_over_entities_and_relations_on_grants(world, api_pool, owner_engine):
    readable = {"alice": {*(k.split("/")[1] for k in OPEN), "granted.txt"}, "zed": {k.split("/")[1] for k in OPEN}}
    checks = await _probe(api_pool, owner_engine, world["tenant_id"], world["tenant"],
                          {"alice": (), "zed": ()}, readable)
    assert checks > 20


async def test_the_leak_probe_over_entities_on_the_shares_own_permissions(owner_engine, worker_engine, api_pool,
                                                                        tmp_path):
    import os

    files = {"eng/plan.txt": (5501, 6501, 0o640, "Acme Corp. acquired Initech GmbH in Berlin."),
             "hr/review.txt": (5502, 6502, 0o600, "Dr. Maria Rossi joined Globex Corporation in Zurich."),
             "pub/news.txt": (5502, 6502, 0o644, "Acme Corp. partners with Hooli Inc. in Paris.")}
    for key, (uid, gid, mode, body) in files.items():
        path = tmp_path / key
        path.parent.mkdir(exist_ok=True)
        path.write_text(body)
        os.chown(path, uid, gid)
        path.chmod(mode)
        path.parent.chmod(0o755)
    db = db_of(owner_engine)
    tenant = f"ent-share-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db, tenant)
    s = admin.add_source(db, tenant, protocol="fs", config={"root": str(tmp_path), "entities": True}, name="share",
                         permissions="from-source", permission_map={"uid:5501": "user:alice", "gid:6501": "group:eng",
                                                                    "uid:5502": "user:hank", "gid:6502": "group:hr"})
    crawl(worker_engine, Corpus(tenant, t.id, s.id, tmp_path))
    assert extract_pending(db_of(worker_engine)) == 3
    principals = {"alice": ("eng",), "bob": ("eng",), "hank": ("hr",), "zed": ()}
    readable = {"alice": {"eng/plan.txt", "pub/news.txt"}, "bob": {"eng/plan.txt", "pub/news.txt"},
                "hank": {"hr/review.txt", "pub/news.txt"}, "zed": {"pub/news.txt"}}
    assert await _probe(api_pool, owner_engine, t.id, tenant, principals, readable) > 30


async def test_get_contents_expands_the_graph_around_a_file_and_a_chunk(world, owner_engine, owner_url):
    from helpers import mcp_client, running_api

    db = db_of(owner_engine)
    admin.update_tenant(db, world["tenant"], tools="search_content,get_contents,find_entity", force=True)
    token = admin.create_token(db, tenant_name=world["tenant"], name="g-zed", subject="user:zed")[0]
    deal = {"source_id": str(world["open"]), "key": "deal.txt"}
    hidden = {"source_id": str(world["closed"]), "key": "secret.txt"}
    with running_api(owner_url) as url:
        async with mcp_client(url, token) as client:
            async def get(ids, **expand):
                return (await client.call_tool("get_contents", {"ids": ids, "expand": expand})).structured_content

            one = (await get([deal], graph=1))["items"][0]
            names = {e["name"]: e for e in one["graph"]["entities"]}
            # Acme is named by the spelling the worker read first ("Acme Corp." or "ACME Corporation")
            assert {"Initech GmbH", "New York", "$4.2 billion", "12 March 2024"} <= set(names)
            assert "acme" in {canonical_key(n) for n in names}
            assert all(e["shared_chunks"] == 1 for e in names.values())  # mentions in this file
            [stated] = one["graph"]["relationships"]
            assert stated["relationship_type"] == "ACQUIRED" and stated["evidence"][0]["uri"] == one["uri"]
            two = (await get([{**deal, "seq": 0}], graph=2))["items"][0]
            hop2 = [r for r in two["graph"]["relationships"] if r["relationship_type"] == "CO_OCCURS"]
            assert hop2 and all(r["evidence"] for r in hop2)
            partners = {e["name"] for e in two["graph"]["entities"] if e["shared_chunks"] is None}
            assert "Maria Rossi" in partners  # named beside Acme in another file zed may read
            assert "Globex Corporation" not in {e["name"] for e in two["graph"]["entities"]}  # only in a hidden file
            plain = (await get([deal, hidden]))["items"]
            assert plain[0].get("graph") is None and plain[1]["found"] is False  # no expand.graph: none
            assert (await get([hidden], graph=2))["items"][0]["found"] is False  # hidden: nothing around it either


async def test_an_admins_alias_and_block_change_what_every_file_names(world, api_pool, owner_url, worker_engine,
                                                                     monkeypatch, capsys):
    import json

    from helpers import cli

    def run(*argv: str):
        return json.loads(cli(monkeypatch, capsys, owner_url, "--json", "entity", *argv, "--tenant", world["tenant"]))

    alias = run("alias", "--name", "Initech GmbH", "--as", "Acme Corp.")
    assert alias["key"] == "initech" and alias["files_to_read_again"] == 4
    assert run("block", "--name", "new york")["kind"] == "block"
    assert {(r["kind"], r["key"]) for r in run("rules")} == {("alias", "initech"), ("block", "new york")}
    try:
        assert extract_pending(db_of(worker_engine)) == 4
        zed = await _entities(api_pool, world, "zed")
        assert ("ORG", "initech") not in zed and ("PLACE", "new york") not in zed
        assert zed[("ORG", "acme")] == 3  # its two mentions and Initech's, read as Acme
    finally:
        run("remove", "--name", "Initech GmbH")
        run("remove", "--name", "New York")
        assert extract_pending(db_of(worker_engine)) == 4
    zed = await _entities(api_pool, world, "zed")
    assert ("ORG", "initech") in zed and ("PLACE", "new york") in zed and zed[("ORG", "acme")] == 2


def test_bench_entity_graph_measures_the_stage_the_bytes_and_find_entity(owner_url, tmp_path):
    from kdbl_control import bench_entity_graph

    lines: list[str] = []
    result = bench_entity_graph.run_entity_graph_bench(owner_url, tmp_path, files=12, chunks=2, n_queries=3,
                                                       log=lines.append)
    assert result["chunks"] == 24 and result["entities"] > 10 and result["mentions"] > result["entities"]
    assert result["relations"] > 0 and result["graph_bytes_per_chunk"] > 0 and result["stage_chunks_per_s"] > 0
    for draw in ("find_entity", "find_entity_uniform"):
        assert set(result[draw]) == {"ids_only", "metadata", "preview", "full"}
        assert all(row["queries"] == 3 and row["p50_ms"] <= row["max_ms"] for row in result[draw].values())
    search = result["search"]
    assert search["lexical"]["queries"] == search["graph"]["queries"] == 3
    assert search["served"].get("graph", 0) == 3  # every question names an entity the corpus names
    assert "names drawn by frequency" in bench_entity_graph.summarise(result)


async def test_the_names_a_document_states_about_itself_are_its_entities(owner_engine, worker_engine, api_pool,
                                                                       tmp_path):
    memo = ('<html><head><meta name="author" content="Doe, Jane; Globex Corporation; jane@globex.example">'
            "<title>Memo</title></head><body><p>Initech GmbH hired John Smith, chief executive of Acme Corp.</p>"
            "</body></html>")
    principal = one_entity_file(owner_engine, worker_engine, tmp_path, "memo.html", memo, prefix="ent-props")
    async with rls_transaction(api_pool, principal) as conn:
        rows = {(r.type, r.key): r.seq for r in await (await conn.execute(
            "SELECT e.type, e.key, m.seq FROM entities e JOIN entity_mentions m ON m.entity_id = e.id")).fetchall()}
        jane = await entity_graph.resolve(conn, "Jane Doe", None)
        graph = await entity_graph.neighbourhood(conn, jane, related=10, edges=10, evidence=3, top_chunks=3)
    assert rows[("PERSON", "jane doe")] == entity_store.PROPERTIES and rows[("ORG", "globex")] == entity_store.PROPERTIES
    assert rows[("ORG", "acme")] >= 0 and ("PERSON", "john smith") in rows  # and what the text names
    assert not any("@" in key for _, key in rows)  # an e-mail address is not a name
    assert (graph.mentions, graph.chunks, graph.files) == (1, 0, 1)  # named by the file, in no chunk
    assert graph.related == [] and graph.top_chunks == []  # properties co-occur with nothing, cite no chunk


async def test_an_e_mails_recipients_are_entities_of_its_header_chunk(owner_engine, worker_engine, api_pool,
                                                                     tmp_path):
    mail = ("From: Ann Lee <ann@acme.example>\n"
            'To: "Doe, Jane" <jane@globex.example>, Bob Roe <bob@initech.example>\n'
            "Cc: Initech GmbH <legal@initech.example>, archive@acme.example\n"
            "Subject: The Globex Corporation offer\nDate: Tue, 3 Mar 2026 10:00:00 +0000\n"
            "Message-ID: <1@acme.example>\n\n"
            "Acme Corp. accepted the offer.\n")
    principal = one_entity_file(owner_engine, worker_engine, tmp_path, "deal.eml", mail, prefix="ent-mail")
    async with rls_transaction(api_pool, principal) as conn:
        rows: dict[tuple[str, str], set[tuple[int, int]]] = {}
        for r in await (await conn.execute(
                "SELECT e.type, e.key, m.seq, m.n FROM entities e JOIN entity_mentions m ON m.entity_id = e.id")).fetchall():
            rows.setdefault((r.type, r.key), set()).add((r.seq, r.n))
        jane = await entity_graph.resolve(conn, "Jane Doe", None)
        graph = await entity_graph.neighbourhood(conn, jane, related=10, edges=10, evidence=3, top_chunks=3)
    # the sender is the file's author (seq -1); the recipients are named by the chunk holding the header block
    assert (entity_store.PROPERTIES, 1) in rows[("PERSON", "ann lee")]  # (the header chunk names her too)
    assert rows[("PERSON", "jane doe")] == {(0, 1)} and rows[("PERSON", "bob roe")] == {(0, 1)}
    assert rows[("ORG", "initech")] == {(0, 1)}
    assert not any("@" in key for _, key in rows)  # a bare address is not a name
    related = {e.name for e, _ in graph.related}
    assert {"Bob Roe", "Acme Corp."} <= related  # she co-occurs with what the message names
