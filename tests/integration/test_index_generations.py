"""Migrations 0014 and 0018's index state: every change that can alter a search moves the state of that
kind of search, nothing else does (a vector written leaves lexical states alone; a source the principal
cannot see, and for vector searches one it does not read, moves nothing), the API role reads its
tenant's in one cheap statement, and concurrent writers of one source do not serialise on one counter row."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from helpers import db_of, make_corpus
from psycopg.rows import namedtuple_row

from kdbl_control import admin
from kdbl_core.db.connect import conninfo
from kdbl_core.db.urls import for_role
from kdbl_core.search.cache import INDEX_STATE, state_for

_STATE = f"SELECT {INDEX_STATE} AS state"
MODES = ("lexical", "semantic", "hybrid")


@pytest.fixture(scope="module")
def world(owner_engine, worker_engine, owner_url, tmp_path_factory):
    name = f"gens-{uuid.uuid4().hex[:10]}"
    root = tmp_path_factory.mktemp("gens")
    one = make_corpus(owner_engine, worker_engine, root / "one", {"a.md": "alpha", "b.md": "beta"}, tenant=name)
    two = make_corpus(owner_engine, worker_engine, root / "two", {"c.md": "gamma"}, tenant=name)
    vault = make_corpus(owner_engine, worker_engine, root / "vault", {"v.md": "delta"}, tenant=name, restricted=True)
    return {"one": one, "two": two, "vault": vault, "owner": db_of(owner_engine), "url": owner_url, "tenant": name}


def connect(world, role: str, subjects: str = "") -> psycopg.Connection:
    conn = psycopg.connect(conninfo(for_role(world["url"], role)), autocommit=True, row_factory=namedtuple_row)
    conn.execute("SELECT set_config('kdbl.tenant_id', %s, false) AS t, set_config('kdbl.subjects', %s, false) AS s",
                 (str(world["one"].tenant_id), subjects))
    return conn


def states(world, source_id: uuid.UUID | None = None, subjects: str = "") -> dict[str, int]:
    """The state of each mode's result, for a search filtered to `source_id` (None: unfiltered)."""
    with connect(world, "kdbl_api", subjects) as api:
        row = api.execute(_STATE, {"sid": str(source_id) if source_id else None, "sids": []}).fetchone()
    return {mode: state_for(tuple(row.state), mode) for mode in MODES}


def moved(before: dict[str, int], after: dict[str, int]) -> set[str]:
    assert all(after[m] >= before[m] for m in MODES)  # never back to an earlier value
    return {m for m in MODES if after[m] != before[m]}


def write(world, sql: str, *params) -> None:
    with connect(world, "kdbl_worker") as worker:
        worker.execute(sql, params)


def test_a_file_write_moves_every_lexical_state_and_the_vector_states_of_its_own_source_only(world):
    one, two = world["one"].source_id, world["two"].source_id
    before_one, before_two, before_all = states(world, one), states(world, two), states(world)
    write(world, "UPDATE files SET size = coalesce(size, 0) + 1 WHERE source_id = %s AND key = 'a.md'", one)
    assert moved(before_one, states(world, one)) == set(MODES)
    assert moved(before_all, states(world)) == set(MODES)
    # filtered to the other source: BM25's statistics span every source the principal sees, a cosine does not
    assert moved(before_two, states(world, two)) == {"lexical", "hybrid"}


def test_a_vector_written_moves_the_vector_states_and_never_the_lexical_one(world):
    one, two = world["one"].source_id, world["two"].source_id
    before_one, before_two, before_all = states(world, one), states(world, two), states(world)
    write(world, "UPDATE chunks SET embedding_model = 'model-' || id WHERE source_id = %s", one)
    assert moved(before_one, states(world, one)) == {"semantic", "hybrid"}
    assert moved(before_all, states(world)) == {"semantic", "hybrid"}
    assert moved(before_two, states(world, two)) == set()  # a source the search does not read


def test_a_chunk_changed_in_anything_but_its_vector_moves_the_content_state(world):
    one = world["one"].source_id
    before = states(world, one)
    write(world, "UPDATE chunks SET token_count = coalesce(token_count, 0) + 1 WHERE source_id = %s", one)
    assert moved(before, states(world, one)) == set(MODES)


def test_a_source_the_principal_cannot_see_moves_none_of_its_states(world):
    vault = world["vault"].source_id
    before = states(world)
    write(world, "UPDATE files SET size = coalesce(size, 0) + 1 WHERE source_id = %s", vault)
    write(world, "UPDATE chunks SET embedding_model = 'model-' || id WHERE source_id = %s", vault)
    assert moved(before, states(world)) == set()
    # a principal the vault is granted to (one file of it: the source's writes may change what it sees)
    grant = admin.add_grant(world["owner"], source_id=vault, subject="group:audit", file_key="v.md")
    try:
        granted = states(world, subjects="group:audit")
        write(world, "UPDATE files SET size = coalesce(size, 0) + 1 WHERE source_id = %s", vault)
        assert moved(granted, states(world, subjects="group:audit")) == set(MODES)
    finally:
        admin.revoke_grant(world["owner"], grant.id, force=True)


def test_a_re_crawl_that_only_touches_seen_at_moves_nothing(world):
    before = states(world)
    write(world, "UPDATE files SET seen_at = now() WHERE source_id = %s", world["one"].source_id)
    write(world, "UPDATE chunks SET embedding_model = embedding_model WHERE source_id = %s", world["one"].source_id)
    assert moved(before, states(world)) == set()


def test_grants_acl_mode_policy_and_deletion_each_move_every_state(world):
    one, two = world["one"], world["two"]
    grant = []
    steps = [
        lambda: grant.append(admin.add_grant(world["owner"], source_id=two.source_id, subject="user:x",
                                             file_key="c.md")),
        lambda: admin.revoke_grant(world["owner"], grant[0].id, force=True),
        lambda: admin.set_source_acl(world["owner"], two.source_id, restricted=True, force=True),
        lambda: admin.update_tenant(world["owner"], world["tenant"], downloads="off", force=True),
        lambda: write(world, "DELETE FROM files WHERE source_id = %s AND key = 'b.md'", one.source_id),
    ]
    for step in steps:
        before = states(world, one.source_id)
        step()
        assert moved(before, states(world, one.source_id)) == set(MODES)


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
