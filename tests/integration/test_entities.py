"""Named entities (issue 31) in a real database: the worker's background stage reads them from stored chunks
of sources with `entities: true`, and row-level security trims them to what the caller may read — an entity
named only in a hidden file does not exist for it, and every count is a count of readable mentions. A file
indexed again is read again; a source switched off loses its entities at once."""

from __future__ import annotations

import uuid

import pytest
from helpers import Corpus, crawl, db_of
from sqlalchemy import text

from kdbl_control import admin
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.content import entity_store
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
    root = tmp_path_factory.mktemp("entities")
    for key, body in {**OPEN, **HIDDEN}.items():
        (root / key).parent.mkdir(parents=True, exist_ok=True)
        (root / key).write_text(body)
    db = db_of(owner_engine)
    tenant = f"ent-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db, tenant)
    opened = admin.add_source(db, tenant, protocol="fs", config={"root": str(root / "news"), "entities": True},
                              name="news")
    closed = admin.add_source(db, tenant, protocol="fs", config={"root": str(root / "board"), "entities": True},
                              name="board", restricted=True)
    admin.add_grant(db, source_id=closed.id, subject="user:alice", file_key="granted.txt")
    for source in (opened, closed):
        crawl(worker_engine, Corpus(tenant, t.id, source.id, root))
    assert extract_pending(db_of(worker_engine)) == 4
    return {"tenant": tenant, "tenant_id": t.id, "open": opened.id, "closed": closed.id, "root": root}


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
