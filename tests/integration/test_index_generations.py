"""Migration 0014's index state: every change that can alter a search moves it, nothing else does, the
API role reads its tenant's in one cheap statement, and concurrent writers of one source do not
serialise on one counter row."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from helpers import db_of, make_corpus
from psycopg.rows import namedtuple_row

from kdbl_control import admin
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role
from kdbl_core.search.cache import INDEX_STATE

_STATE = f"SELECT {INDEX_STATE} AS state"


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"gens-{uuid.uuid4().hex[:10]}"
    root = tmp_path_factory.mktemp("gens")
    one = make_corpus(owner_engine, worker_engine, root / "one", {"a.md": "alpha", "b.md": "beta"}, tenant=name)
    two = make_corpus(owner_engine, worker_engine, root / "two", {"c.md": "gamma"}, tenant=name)
    return {"one": one, "two": two, "owner": db_of(owner_engine), "url": owner_url, "tenant": name}


def connect(world, role: str) -> psycopg.Connection:
    conn = psycopg.connect(conninfo(for_role(world["url"], role)), autocommit=True, row_factory=namedtuple_row)
    conn.execute("SELECT set_config('kdbl.tenant_id', %s, false)", (str(world["one"].tenant_id),))
    return conn


def state(world, source_id: uuid.UUID | None = None) -> int:
    with connect(world, "kdbl_api") as api:
        return api.execute(_STATE, {"sid": str(source_id) if source_id else None, "sids": []}).fetchone().state


def test_a_file_write_moves_its_sources_state_and_not_another_sources(world):
    one, two = world["one"].source_id, world["two"].source_id
    before_one, before_two, before_all = state(world, one), state(world, two), state(world)
    with connect(world, "kdbl_worker") as worker:
        worker.execute("UPDATE files SET size = coalesce(size, 0) + 1 WHERE source_id = %s AND key = 'a.md'", (one,))
    assert state(world, one) > before_one and state(world) > before_all
    assert state(world, two) == before_two


def test_a_re_crawl_that_only_touches_seen_at_moves_nothing(world):
    before = state(world)
    with connect(world, "kdbl_worker") as worker:
        worker.execute("UPDATE files SET seen_at = now() WHERE source_id = %s", (world["one"].source_id,))
    assert state(world) == before


def test_vectors_grants_acl_mode_policy_and_deletion_each_move_the_state(world):
    one, two = world["one"], world["two"]
    steps = []
    with connect(world, "kdbl_worker") as worker:
        steps.append(lambda: worker.execute("UPDATE chunks SET embedding_model = 'm' WHERE source_id = %s",
                                            (two.source_id,)))
        grant = []
        steps.append(lambda: grant.append(admin.add_grant(world["owner"], source_id=two.source_id,
                                                          subject="user:x", file_key="c.md")))
        steps.append(lambda: admin.revoke_grant(world["owner"], grant[0].id, force=True))
        steps.append(lambda: admin.set_source_acl(world["owner"], two.source_id, restricted=True, force=True))
        steps.append(lambda: admin.update_tenant(world["owner"], world["tenant"], downloads="off", force=True))
        steps.append(lambda: worker.execute("DELETE FROM files WHERE source_id = %s AND key = 'b.md'",
                                            (one.source_id,)))
        for step in steps:
            before = state(world, two.source_id if step is not steps[-1] else one.source_id)
            step()
            assert state(world, two.source_id if step is not steps[-1] else one.source_id) > before


def test_concurrent_writers_of_one_source_do_not_wait_on_one_counter_row(world):
    source = world["one"].source_id
    conns: list[psycopg.Connection] = []
    shards: dict[int, psycopg.Connection] = {}
    try:
        while len(shards) < 2 and len(conns) < 20:  # two backends in different shards
            conns.append(connect(world, "kdbl_worker"))
            shards.setdefault(conns[-1].info.backend_pid % 16, conns[-1])
        first, second = list(shards.values())[:2]
        first.execute("BEGIN")
        first.execute("UPDATE files SET size = coalesce(size, 0) + 1 WHERE source_id = %s AND key = 'a.md'",
                      (source,))
        second.execute("BEGIN")
        second.execute("SET LOCAL lock_timeout = '2s'")
        second.execute("INSERT INTO files (tenant_id, source_id, key, size) VALUES (%s, %s, 'new.md', 1)",
                       (world["one"].tenant_id, source))  # with one row per source this would wait, then fail
        second.execute("COMMIT")
        first.execute("COMMIT")
    finally:
        for c in conns:
            c.close()


def test_the_api_reads_the_state_from_the_primary_key_index(world):
    with connect(world, "kdbl_api") as api:
        api.execute("SET enable_seqscan = off")  # a tiny test table: what matters is that the index serves it
        params = {"sid": str(world["one"].source_id), "sids": []}
        plan = "\n".join(r[0] for r in api.execute("EXPLAIN " + _STATE, params))
    assert "index_generations_pkey" in plan
