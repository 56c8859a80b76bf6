"""Read replicas for real (issue 32): a primary and a hot standby made from the embedded binaries
(tests/standby.py: pg_basebackup -R, streaming over the unix socket), the API reading MCP calls on the
standby (KDBL_DATABASE_READ_URL) and writing tokens' state, rate limits and audit rows on the primary.

What is proved here: calls read on the standby (a file the paused standby has not replayed is not found,
then is, once it has) and every one of them is audited on the primary; a revoked token is refused at once;
a standby past the lag bound, or behind a cursor's index state, sends calls to the primary; killing the
standby mid-load gives no wrong answer and the API goes back to it once it is back; a recovery conflict
(SQLSTATE 40001) runs the call once on the primary; promoting the standby keeps every audit row.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from helpers import Corpus, crawl, db_of, mcp_client, running_api
from sqlalchemy import create_engine, pool, text

from kdbl_control import admin
from kdbl_control.standby import Standby
from kdbl_core.access.principal import Principal
from kdbl_core.db.async_pool import AsyncPool, Statement
from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.db.urls import for_role, normalise
from kdbl_core.settings import Settings

FILES = {f"doc{n}.txt": f"Report {n} on the copper kettle trade in Lisbon, volume {n}." for n in range(12)}
DEADLINE_S = 60.0  # for conditions (replay, fallback), never a fixed wait


@pytest.fixture(scope="module")
def pair():
    primary_dir = Path(tempfile.mkdtemp(prefix="kdbl-test-primary-"))
    standby_dir = Path(tempfile.mkdtemp(prefix="kdbl-test-standby-"))
    primary = EmbeddedDatabase(primary_dir)
    primary.start()
    standby = Standby(primary, standby_dir / "s")
    try:
        standby.create()
        standby.start()
        yield primary, standby
    finally:
        standby.destroy()
        primary.stop()
        shutil.rmtree(primary_dir, ignore_errors=True)
        shutil.rmtree(standby_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def world(pair, tmp_path_factory):
    primary, standby = pair
    owner = create_engine(normalise(primary.owner_url), poolclass=pool.NullPool)
    worker = create_engine(normalise(for_role(primary.owner_url, "kdbl_worker")), poolclass=pool.NullPool)
    root = tmp_path_factory.mktemp("replica")
    for name, body in FILES.items():
        (root / name).write_text(body)
    tenant = f"replica-{uuid.uuid4().hex[:8]}"
    t = admin.create_tenant(db_of(owner), tenant)
    source = admin.add_source(db_of(owner), tenant, protocol="fs", config={"root": str(root)}, name="reports")
    crawl(worker, Corpus(tenant, t.id, source.id, root))
    token = admin.create_token(db_of(owner), tenant_name=tenant, name="agent")[0]
    standby.wait_replayed()
    yield {"owner": owner, "worker": worker, "root": root, "tenant": tenant, "tenant_id": t.id,
           "source_id": source.id, "token": token, "corpus": Corpus(tenant, t.id, source.id, root)}
    owner.dispose()
    worker.dispose()


def _audited(world) -> int:
    with world["owner"].begin() as conn:
        return conn.execute(text("SELECT count(*) FROM audit WHERE tenant_id = :t"), {"t": world["tenant_id"]}).scalar()


def _add_file(world, name: str, body: str) -> None:
    (world["root"] / name).write_text(body)
    crawl(world["worker"], world["corpus"])


async def _keys(client, query: str) -> list[str]:
    result = (await client.call_tool("search_content", {"query": query, "mode": "lexical", "limit": 20}))
    assert not result.is_error, result
    return sorted(h["key"] for h in result.structured_content["hits"])


def _readyz(url: str) -> dict:
    return httpx.get(f"{url}/readyz").json()


def _settings(max_lag_s: float) -> Settings:
    return Settings(mcp_enabled=True, read_max_lag_s=max_lag_s, metrics_port=0)


def _serving(pair, max_lag_s: float):
    primary, standby = pair
    return running_api(primary.owner_url, _settings(max_lag_s), read_url=standby.url("kdbl_api"))


async def test_calls_read_on_the_standby_and_are_audited_on_the_primary(pair, world):
    primary, standby = pair
    with _serving(pair, max_lag_s=300) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper kettle")) == 12  # warms the read pool and the WAL samples
            before = _audited(world)
            standby.sql("SELECT pg_wal_replay_pause()")
            try:
                _add_file(world, "late.txt", "A zanzibarite shipment reached Lisbon late.")
                # the primary has the file; the paused standby, well within the bound, does not: reads are there
                assert await _keys(client, "zanzibarite") == []
                tools = (await client.list_tools()).tools
                assert any(t.name == "search_content" for t in tools)
            finally:
                standby.sql("SELECT pg_wal_replay_resume()")
            standby.wait_replayed()
            assert await _keys(client, "zanzibarite") == ["late.txt"]
            reads = _readyz(url)["reads"]
            assert reads["reads"] == "replica" and reads["recent_fallbacks"] == []
            assert reads["replica_lag_s"] is not None and reads["replica_lag_s"] < 300
    # every call, on the standby or not, has its row on the primary (tools/list is no call)
    assert _audited(world) == before + 2
    assert standby.sql("SELECT pg_is_in_recovery()")[0][0]


async def test_a_revoked_token_is_refused_at_once_while_the_standby_lags(pair, world):
    primary, standby = pair
    token = admin.create_token(db_of(world["owner"]), tenant_name=world["tenant"], name="revoked")[0]
    with _serving(pair, max_lag_s=300) as url:
        async with mcp_client(url, token) as client:
            assert len(await _keys(client, "copper")) >= 12
        standby.sql("SELECT pg_wal_replay_pause()")
        try:
            assert admin.revoke_token(db_of(world["owner"]), token) == 1
            answer = httpx.post(f"{url}/mcp", headers={
                "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json"}, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert answer.status_code == 401  # the token's state is read on the primary, not the lagging standby
        finally:
            standby.sql("SELECT pg_wal_replay_resume()")
    standby.wait_replayed()


async def test_a_result_whose_audit_row_fails_on_the_primary_is_not_sent(pair, world):
    from mcp.shared.exceptions import MCPError

    from kdbl_core.errors import UNAVAILABLE

    with _serving(pair, max_lag_s=300) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper")) >= 12
            with world["owner"].begin() as conn:
                conn.execute(text("REVOKE INSERT ON audit FROM kdbl_api"))
            try:
                with pytest.raises(MCPError) as err:
                    await client.call_tool("search_content", {"query": "copper", "mode": "lexical"})
            finally:
                with world["owner"].begin() as conn:
                    conn.execute(text("GRANT INSERT ON audit TO kdbl_api"))
            assert err.value.code == UNAVAILABLE and "audit row" in err.value.message
            assert (err.value.error.data or {}).get("retry_after_sec") == 1
            assert len(await _keys(client, "copper")) >= 12  # audited again: served again


async def test_a_new_file_is_found_within_the_lag_bound(pair, world):
    bound_s = 2.0
    with _serving(pair, max_lag_s=bound_s) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper")) >= 12
            _add_file(world, "fresh.txt", "The marzipan consignment arrived in Lisbon this morning.")
            committed = time.monotonic()
            while await _keys(client, "marzipan") != ["fresh.txt"]:
                # the standby's answer until it replays the file; past the bound the primary's: never later
                assert time.monotonic() - committed < bound_s + 5.0, "not found within the lag bound"
                await asyncio.sleep(0.05)


async def test_a_standby_past_the_lag_bound_sends_the_calls_to_the_primary(pair, world):
    primary, standby = pair
    with _serving(pair, max_lag_s=1.0) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper")) >= 12
            standby.sql("SELECT pg_wal_replay_pause()")
            try:
                _add_file(world, "later.txt", "The quillwort harvest report, filed after the pause.")
                deadline = time.monotonic() + DEADLINE_S
                while (found := await _keys(client, "quillwort")) == []:  # the standby's answer, until the bound
                    assert time.monotonic() < deadline, "the calls never went to the primary"
                    await asyncio.sleep(0.2)
                assert found == ["later.txt"]  # the primary's answer: the standby has not replayed it
                reasons = {f["reason"] for f in _readyz(url)["reads"]["recent_fallbacks"]}
                assert reasons == {"lag"}
                metrics = httpx.get(f"{url}/readyz").json()["reads"]
                assert metrics["replica_lag_s"] is None or metrics["replica_lag_s"] >= 1.0
            finally:
                standby.sql("SELECT pg_wal_replay_resume()")
    standby.wait_replayed()


async def test_a_cursor_cut_ahead_of_the_standby_is_behind_not_stale(pair, world):
    primary, standby = pair
    with _serving(pair, max_lag_s=300) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper")) >= 12  # its lag bound has a sample from before the write
            standby.wait_replayed()
            standby.sql("SELECT pg_wal_replay_pause()")
            try:
                _add_file(world, "extra.txt", "Copper kettle exports, an extra note on the trade.")
                with running_api(primary.owner_url, _settings(300)) as direct:  # the primary only: its state's cursor
                    async with mcp_client(direct, world["token"]) as on_primary:
                        first = (await on_primary.call_tool("search_content", {
                            "query": "copper kettle", "mode": "lexical", "limit": 5})).structured_content
                assert first["next_cursor"]
                second = await client.call_tool("search_content", {
                    "query": "copper kettle", "mode": "lexical", "limit": 5, "cursor": first["next_cursor"]})
                assert not second.is_error, second  # not "stale": the standby is behind, the primary serves it
                keys = [h["key"] for h in second.structured_content["hits"]]
                assert len(keys) == 5 and not set(keys) & {h["key"] for h in first["hits"]}
                assert {f["reason"] for f in _readyz(url)["reads"]["recent_fallbacks"]} == {"behind"}
            finally:
                standby.sql("SELECT pg_wal_replay_resume()")
    standby.wait_replayed()


async def test_killing_the_standby_mid_load_gives_no_wrong_answer_and_the_api_returns_to_it(pair, world):
    primary, standby = pair
    with running_api(primary.owner_url, _settings(300)) as direct:
        async with mcp_client(direct, world["token"]) as client:
            expected = {q: await _keys(client, q) for q in ("copper kettle", "Lisbon", "volume")}
    with _serving(pair, max_lag_s=300) as url:
        wrong, done = [], 0

        async def load(client, n: int) -> None:
            nonlocal done
            for i in range(n):
                query = list(expected)[i % 3]
                got = await _keys(client, query)
                if got != expected[query]:
                    wrong.append((query, got))
                done += 1

        async with mcp_client(url, world["token"]) as a, mcp_client(url, world["token"]) as b:
            await load(a, 3)
            task = asyncio.gather(load(a, 30), load(b, 30))
            while done < 10:
                await asyncio.sleep(0.01)
            await asyncio.to_thread(standby.kill)  # mid-load
            await task
            assert wrong == [] and done == 63
            assert "unavailable" in {f["reason"] for f in _readyz(url)["reads"]["recent_fallbacks"]}
            await asyncio.to_thread(standby.start)
            await asyncio.to_thread(standby.wait_replayed)
            deadline = time.monotonic() + DEADLINE_S
            while True:  # back on the standby: a call that adds no fallback
                before = len(_readyz(url)["reads"]["recent_fallbacks"])
                assert await _keys(a, "volume") == expected["volume"]
                if len(_readyz(url)["reads"]["recent_fallbacks"]) == before:
                    break
                assert time.monotonic() < deadline, "the API never read the standby again"
                await asyncio.sleep(0.2)


async def test_a_recovery_conflict_reruns_the_call_once_on_the_primary(pair, world):
    from kdbl_api.audit import AuditFacts
    from kdbl_api.observability import Observability
    from kdbl_api.read_route import ReadRoute
    from psycopg.errors import SerializationFailure

    primary, standby = pair
    standby.stop()
    standby.streaming_delay = "200ms"  # cancel a conflicting standby query quickly
    standby.start()
    try:
        principal = Principal(tenant_id=world["tenant_id"], tenant_name=world["tenant"], subject="user:conflict")
        primary_pool = AsyncPool(for_role(primary.owner_url, "kdbl_api").replace("postgresql+psycopg", "postgresql"),
                                 2, name="t-primary")
        reads = AsyncPool(standby.url("kdbl_api").replace("postgresql+psycopg", "postgresql"), 2, name="t-reads")
        await primary_pool.open()
        route = ReadRoute(primary_pool, reads, max_lag_s=300, observability=Observability())
        await route.start()
        try:
            while route.bound.required() is None:
                await asyncio.sleep(0.05)
            attempts: list[bool] = []

            async def body(conn, opened):
                standby_now = (await (await conn.execute("SELECT pg_is_in_recovery() AS r")).fetchone()).r
                attempts.append(standby_now)
                if standby_now:  # holds a lock on chunks on the standby until the replayed lock cancels it
                    await conn.execute("SELECT count(*) FROM chunks, pg_sleep(20)")
                count = (await (await conn.execute("SELECT count(*) AS n FROM chunks")).fetchone()).n
                return {"chunks": count}, AuditFacts(row_count=count)

            def lock_on_the_primary() -> None:
                deadline = time.monotonic() + DEADLINE_S
                while not standby.sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_sleep(20)%' "
                                      "AND state = 'active' AND pid <> pg_backend_pid()")[0][0]:
                    assert time.monotonic() < deadline
                    time.sleep(0.02)
                with psycopg.connect(primary.owner_url.replace("postgresql+psycopg", "postgresql")) as conn:
                    conn.execute("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE")  # committed: replayed on the standby

            def row_of(facts):
                return {"tenant_id": principal.tenant_id, "principal": principal.subject, "token_id": None,
                        "tool": "conflict-test", "arguments": {}, "source_ids": [], "keys": [],
                        "row_count": facts.row_count, "status": facts.status, "error": None, "client_ip": None,
                        "duration_ms": 0.0}

            locker = threading.Thread(target=lock_on_the_primary)
            locker.start()
            before = _audited(world)
            result, facts = await route.run(principal, tool="list_sources", deadline_ms=60_000, extra_s=0,
                                            opened=Statement("SELECT 1", ()), body=body, row_of=row_of,
                                            rerunnable=lambda: True, on_exceeded=lambda where: None)
            locker.join()
            assert attempts == [True, False] and result["chunks"] >= 12  # the standby's, cancelled; the primary's
            assert [f[1] for f in route.last_fallbacks] == ["conflict"] and _audited(world) == before + 1

            attempts.clear()  # a streamed answer that already sent progress is not run again
            locker = threading.Thread(target=lock_on_the_primary)
            locker.start()
            with pytest.raises(SerializationFailure):
                await route.run(principal, tool="answer", deadline_ms=60_000, extra_s=0, opened=None, body=body,
                                row_of=row_of, rerunnable=lambda: False, on_exceeded=lambda where: None)
            locker.join()
            assert attempts == [True]
        finally:
            await route.stop()
            await primary_pool.close()
    finally:
        standby.stop()
        standby.streaming_delay = "5s"
        standby.start()
        standby.wait_replayed()


def test_the_hot_tables_keep_their_trailing_pages_on_both_servers(pair):
    primary, standby = pair
    query = ("SELECT c.relname FROM pg_class c WHERE 'vacuum_truncate=false' = ANY (c.reloptions) "
             "ORDER BY c.relname")
    with psycopg.connect(primary.owner_url.replace("postgresql+psycopg", "postgresql")) as conn:
        on_primary = [r[0] for r in conn.execute(query)]
    assert {"chunks", "files", "bm25_lists", "term_stats", "index_generations"} <= set(on_primary)
    assert [r[0] for r in standby.sql(query)] == on_primary
    assert standby.sql("SHOW hot_standby_feedback")[0][0] == "on"


async def test_the_primary_lost_is_503_and_promoting_the_standby_keeps_every_audit_row(pair, world):
    primary, standby = pair
    with _serving(pair, max_lag_s=300) as url:
        async with mcp_client(url, world["token"]) as client:
            assert len(await _keys(client, "copper")) >= 12
        audited = _audited(world)
        standby.wait_replayed()
        primary.stop()  # the primary is lost: the standby is up, yet no call may go unaudited
        answer = httpx.post(f"{url}/mcp", headers={
            "Authorization": f"Bearer {world['token']}", "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json"}, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert answer.status_code == 503 and answer.headers["Retry-After"] == "1"
    # the standby takes over
    standby.sql("SELECT pg_promote(true, 60)")
    assert standby.sql("SELECT pg_is_in_recovery()")[0][0] is False
    promoted = create_engine(normalise(standby.url()), poolclass=pool.NullPool)
    try:
        with promoted.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM audit WHERE tenant_id = :t"),
                                {"t": world["tenant_id"]}).scalar() == audited
        with running_api(standby.url(), _settings(300)) as url:  # the new primary, nothing to read elsewhere
            async with mcp_client(url, world["token"]) as client:
                assert len(await _keys(client, "copper")) >= 12
        with promoted.begin() as conn:
            assert conn.execute(text("SELECT count(*) FROM audit WHERE tenant_id = :t"),
                                {"t": world["tenant_id"]}).scalar() == audited + 1
    finally:
        promoted.dispose()


def test_bench_replica_measures_reads_on_a_standby_beside_the_primary(pg_dir, tmp_path):
    from helpers import write_beir

    from kdbl_control import bench_replica

    docs = {f"d{i}": (f"Report {i}", f"The okapi migration report number {i} from the forest.") for i in range(20)}
    beir = write_beir(tmp_path / "tiny", docs, {f"q{i}": q for i, q in enumerate(["okapi migration", "forest"])})
    lines: list[str] = []
    with EmbeddedDatabase(pg_dir) as db:
        result = bench_replica.run_replica_bench(db, beir, tmp_path / "work", clients=2, seconds=1.0, n_queries=2,
                                                 log=lines.append)
    assert result["chunks"] == 20 and result["wal_bytes_per_chunk"] > 0 and result["catch_up_s"] >= 0
    for target in ("primary", "standby"):
        one, many = result["reads"][target]["http_1_client"], result["reads"][target]["http_n_clients"]
        assert one["errors"] == 0 and many["errors"] == 0 and many["requests"] > 2, many["error_samples"]
    assert "standby" in result["reads"]["standby"]["http_n_clients"]["cpu_ms_per_request"]
    assert not (tmp_path / "work" / "standby").exists()  # the standby is gone with the run
    assert "WAL" in bench_replica.summarise(result)
