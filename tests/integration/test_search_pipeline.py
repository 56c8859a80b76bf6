"""The search pipeline behind one entry point (kdbl_core.search.plan.SearchPlan), as the MCP tool runs it.

Round trips are counted on the wire (libpq's trace of the pooled connection the API uses: one Sync or
simple Query per round trip), inside the RLS transaction, so the BEGIN (pipelined with the principal's
settings) and the COMMIT come on top. The modules are those of the project a call passes through
(sys.setprofile), from the tool's handler to the SQL.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH  # the longest text whose parse psycopg caches
from helpers import db_of, make_corpus

from kdbl_api.tools import search
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import SearchContentArgs
from kdbl_api.tools.search import search_content
from kdbl_core.access.policy import TenantPolicy
from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
from kdbl_core.access.signing import CursorCodec
from kdbl_core.db import connect, sql_text
from kdbl_core.db.urls import for_role
from kdbl_core.errors import InvalidArgument
from kdbl_core.search import bm25_native, lexical, pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings

REPO = Path(__file__).resolve().parents[2]
GATEWAY = "The API gateway returned a connection timeout while the upstream service was overloaded. "


@pytest.fixture(scope="module")
def corpus(owner_engine, worker_engine, tmp_path_factory, embedder):
    from kdbl_worker.vectorize import embed_pending

    # more chunks than an arm's depth (10): the keyword arm finds gateways, the vector arm cats
    files = {f"gateway-{i}.md": GATEWAY * 3 + f"Incident {i}." for i in range(12)}
    files.update({f"cat-{i}.md": f"The feline rested quietly upon the woven rug, evening {i}."
                  for i in range(12)})
    files["licence.md"] = "Code ERR4021: the licence file is missing from the installation directory."
    tenant = f"pipe-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("pipeline") / "kb"
    made = make_corpus(owner_engine, worker_engine, root, files, tenant=tenant)
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=made.tenant_id, batch=16) > 0
    return made


def _principal(corpus) -> Principal:
    return Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:pipeline",
                     scopes=frozenset(ALL_SCOPES))


async def _traced_search(owner_url, corpus, embedder, **args) -> tuple[dict, int, set[str], list[list[str]]]:
    """(result, round trips inside the transaction, project modules passed through, the frontend
    messages sent) of one search_content."""
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    services = Services(settings=Settings(hybrid_depth=10), cursors=CursorCodec(b"k" * 32), embedder=embedder)
    modules: set[str] = set()

    def profile(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and "/services/" in name:
            modules.add(str(Path(name).relative_to(REPO)))

    try:
        with tempfile.TemporaryFile("w+") as trace:
            async with rls_transaction(pool, _principal(corpus)) as conn:
                ctx = ToolContext(conn=conn, principal=_principal(corpus), services=services)
                await bm25_native.available(conn)  # once per server every 5 minutes, not per call: not counted
                conn.pgconn.trace(os.dup(trace.fileno()))
                conn.pgconn.set_trace_flags(1)  # psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
                sys.setprofile(profile)
                try:
                    result, _facts = await search_content(ctx, SearchContentArgs(**args))
                finally:
                    sys.setprofile(None)
                    conn.pgconn.untrace()  # flushes the trace
            trace.seek(0)
            sent = [line.split("\t") for line in trace.read().splitlines()]
    finally:
        await pool.close()
    round_trips = sum(1 for f in sent if len(f) > 2 and f[0] == "F" and f[2] in ("Sync", "Query"))
    return result, round_trips, modules, [f for f in sent if len(f) > 2 and f[0] == "F"]


# pgvector's text form of a vector, as a query parameter: '[0.0123,-0.04...'
_TEXT_VECTOR = re.compile(r"'\[-?\d+(\.\d+)?(e-?\d+)?,-?\d")


async def test_a_hybrid_search_takes_seven_round_trips_and_one_for_tied_near_copies_a_semantic_three_a_lexical_two(
        owner_url, corpus, embedder):
    hybrid, hybrid_trips, modules, _ = await _traced_search(
        owner_url, corpus, embedder, query="ERR4021 gateway cat sleeping on a carpet", limit=10, explain=True)
    semantic, semantic_trips, _, _ = await _traced_search(owner_url, corpus, embedder, query="cat on a carpet",
                                                       mode="semantic")
    lexical, lexical_trips, _, _ = await _traced_search(owner_url, corpus, embedder, query="gateway incident 3",
                                                     mode="lexical", limit=1)
    filtered, filtered_trips, _, _ = await _traced_search(owner_url, corpus, embedder, query="gateway incident 3",
                                                       mode="lexical", source_id=str(corpus.source_id), limit=1)
    _, tied_trips, _, _ = await _traced_search(owner_url, corpus, embedder, query="gateway", mode="lexical")
    print(f"round trips: hybrid {hybrid_trips}, semantic {semantic_trips}, lexical {lexical_trips}, "
          f"lexical+source {filtered_trips}; modules ({len(modules)}): {sorted(modules)}")
    assert hybrid["mode"] == "hybrid" and semantic["mode"] == "semantic" and not hybrid["degraded"]
    assert hybrid["hits"][0]["key"] == "licence.md" and hybrid["hits"][0]["explain"]["pinned_identifier"]
    explained = [h["explain"] for h in hybrid["hits"]]
    assert any(e["vector_rank"] is None for e in explained)  # each arm missed some: both rerank lookups ran
    assert any(e["lexical_rank"] is None for e in explained)
    assert lexical["mode"] == filtered["mode"] == "lexical" and lexical["hits"] and filtered["hits"]
    # preflight, vector arm, keyword arm, identifier pin, both arms' rerank lookups, windows (was 10); and
    # one more here: the gateway files differ in one number, tie on BM25 and embed alike, so one statement
    # reads their normalised text keys (are they copies?)
    assert hybrid_trips == 7 + 1
    assert semantic_trips == 3  # preflight, vector arm, windows (was 4)
    # preflight (the index state of issue 16's cache and cursors; with source_id the source check too), and
    # the keyword arm with the hits' windows in the same statement (issue 33: was 3, the windows apart)
    assert lexical_trips == 2 and filtered_trips == 2
    # the twelve gateway files tie on "gateway": one statement reads the tied chunks' text keys (copies?)
    assert tied_trips == 3
    assert "services/core/kdbl_core/search/pipeline.py" in modules


async def test_the_query_vector_travels_in_binary_not_as_a_text_literal(owner_url, corpus, embedder):
    result, _, _, sent = await _traced_search(owner_url, corpus, embedder, query="cat on a carpet", mode="semantic")
    binds = ["\t".join(f) for f in sent if f[2] == "Bind"]
    assert result["mode"] == "semantic" and binds
    # the vector arm's parameter: 384 float32s in pgvector's binary form (was ~3,800 characters of text)
    assert not [b for b in binds if _TEXT_VECTOR.search(b)]
    assert any(len(b) > 4 * 384 for b in binds)


async def test_a_source_the_caller_cannot_see_is_refused_in_every_mode(owner_url, corpus, embedder):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    try:
        for mode in pipeline.MODES:
            request = pipeline.SearchRequest(query="gateway", mode=mode,
                                             filters=pipeline.Filters(source_id=uuid.uuid4()))
            async with rls_transaction(pool, _principal(corpus)) as conn:
                with pytest.raises(InvalidArgument, match="unknown source"):
                    await SearchPlan(request, settings=Settings(), embedder=embedder).run(conn)
    finally:
        await pool.close()


async def test_a_tenant_whose_policy_allows_lexical_only_is_served_lexically_and_told_why(owner_url, corpus,
                                                                                          embedder):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    try:
        async with rls_transaction(pool, _principal(corpus)) as conn:
            result = await SearchPlan(pipeline.SearchRequest(query="ERR4021", mode="semantic"), settings=Settings(),
                                      embedder=embedder, allowed_modes=("lexical",)).run(conn)
    finally:
        await pool.close()
    assert result.mode == "lexical" and result.degraded and "policy" in result.degraded_reason
    assert [h["key"] for h in result.hits] == ["licence.md"]


def test_eval_and_bench_search_through_the_core_pipeline_not_the_api() -> None:
    for name in ("evaluate.py", "bench.py"):
        source = (REPO / "services/control/kdbl_control" / name).read_text()
        assert not re.search(r"^\s*(from|import) kdbl_api\b", source, re.M), name
        assert "SearchPlan(" in source, name


class _Traced:
    """What one connection sends while traced (libpq's trace)."""

    def __init__(self, conn) -> None:
        self.conn, self.text = conn, ""

    def __enter__(self) -> _Traced:
        self.conn.prepare_threshold = None  # every statement's text on the wire (Parse), none by a prepared name
        self.file = tempfile.TemporaryFile("w+")
        self.conn.pgconn.trace(os.dup(self.file.fileno()))
        self.conn.pgconn.set_trace_flags(1)  # psycopg.pq.Trace.SUPPRESS_TIMESTAMPS
        return self

    def __exit__(self, *exc) -> None:
        self.conn.pgconn.untrace()  # flushes the trace
        self.file.seek(0)
        self.text = self.file.read()  # a statement's text keeps its line ends
        self.file.close()

    def preflights(self) -> int:
        return self.text.count("AS tenant_on")


async def test_search_content_validates_once_per_call_and_reads_the_preflight_its_plan_sent_with_begin(
        owner_url, corpus, embedder, monkeypatch):
    validated: list[SearchContentArgs] = []
    real = search._validate

    def counted(settings, args):
        validated.append(args)
        return real(settings, args)

    monkeypatch.setattr(search, "_validate", counted)
    services = Services(settings=Settings(hybrid_depth=10), cursors=CursorCodec(b"k" * 32), embedder=embedder)
    args = SearchContentArgs(query="ERR4021 gateway cat", limit=3, response_mode="metadata")
    policy = TenantPolicy()
    opened = search.opening(services, policy, args)  # the registry's hook: arguments checked, the plan made
    assert len(validated) == 1
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    results = []
    try:
        # the first attempt, then a retry's copy of the opening (kdbl_api.read_route), each sent with BEGIN
        for attempt in (opened, dataclasses.replace(opened, rows=None)):
            async with rls_transaction(pool, _principal(corpus), also=attempt) as conn:
                ctx = ToolContext(conn=conn, principal=_principal(corpus), services=services, policy=policy,
                                  opened=attempt)
                with _Traced(conn) as traced:
                    result, _facts = await search_content(ctx, args)
            assert "Bind" in traced.text and traced.preflights() == 0  # the answer came with BEGIN: not sent again
            results.append(result)
    finally:
        await pool.close()
    assert len(validated) == 1  # never again in the handler, nor in the retry
    assert results[0]["mode"] == "hybrid" and results[0]["hits"] and results[0] == results[1]


async def test_a_plan_run_alone_sends_its_preflight_only_where_the_request_needs_one(owner_url, corpus, embedder):
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    settings = Settings(hybrid_depth=10)
    try:
        counts = {}
        for name, request in {
                "lexical": pipeline.SearchRequest(query="gateway incident 3", mode="lexical", limit=1),
                "lexical+source": pipeline.SearchRequest(query="gateway incident 3", mode="lexical", limit=1,
                                                         filters=pipeline.Filters(source_id=corpus.source_id)),
                "hybrid": pipeline.SearchRequest(query="gateway incident 3", limit=1)}.items():
            async with rls_transaction(pool, _principal(corpus)) as conn:
                await bm25_native.available(conn)
                plan = SearchPlan(request, settings=settings, embedder=embedder)
                with _Traced(conn) as traced:
                    result = await plan.run(conn)
            assert result.hits and result.mode == request.mode, name
            counts[name] = traced.preflights()
    finally:
        await pool.close()
    # lexical without a source filter: nothing the preflight tells (`bench search`'s floor, as before)
    assert counts == {"lexical": 0, "lexical+source": 1, "hybrid": 1}


async def test_a_lexical_search_content_plans_generically_from_its_preflight_and_sends_no_setting_around_its_keywords(
        owner_url, corpus, embedder):
    """Issue 33: the lexical call's preflight (sent with BEGIN) sets generic plans for its transaction, so its
    keyword statement goes alone (two statements fewer a call); one with a rationale (custom-planned entity
    lookups after the keyword arm) and a hybrid one keep the setting around the keyword statements."""
    services = Services(settings=Settings(hybrid_depth=10), cursors=CursorCodec(b"k" * 32), embedder=embedder)
    policy = TenantPolicy()
    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    seen = {}
    try:
        for name, args in {"lexical": SearchContentArgs(query="gateway incident 3", mode="lexical", limit=3),
                           "lexical+rationale": SearchContentArgs(query="gateway incident 3", mode="lexical",
                                                                  limit=3, rationale=True),
                           "hybrid": SearchContentArgs(query="gateway incident 3", limit=3)}.items():
            opened = search.opening(services, policy, args)
            async with rls_transaction(pool, _principal(corpus), also=opened) as conn:
                ctx = ToolContext(conn=conn, principal=_principal(corpus), services=services, policy=policy,
                                  opened=opened)
                with _Traced(conn) as traced:
                    result, _facts = await search_content(ctx, args)
                setting = await (await conn.execute("SELECT current_setting('plan_cache_mode')")).fetchone()
            assert result["hits"], name
            seen[name] = (traced.text.count("plan_cache_mode"), setting[0])
    finally:
        await pool.close()
    assert seen["lexical"] == (0, "force_generic_plan")
    for name in ("lexical+rationale", "hybrid"):  # the setting on and off around each keyword statement
        sent, setting = seen[name]
        assert sent >= 2 and sent % 2 == 0 and setting == "auto", (name, seen)


async def test_windows_read_with_the_keyword_statement_are_the_windows_read_apart(owner_url, corpus, embedder,
                                                                                  monkeypatch):
    """Issue 33: a lexical search reads its hits' windows (text, neighbours, locators, the snippets' lexemes) in
    its keyword statement; every page, ties and copies included, is what reading them apart gave."""
    from kdbl_core.search import windows

    pool = await connect.async_pool(for_role(owner_url, "kdbl_api"), size=1)
    settings = Settings(hybrid_depth=10)
    requests = [pipeline.SearchRequest(query=q, mode="lexical", limit=limit)
                for q in ("gateway incident 3", "gateway", "cat sleeping on a carpet", "ERR4021 licence")
                for limit in (1, 5, 20)]

    async def results() -> list:
        out = []
        for request in requests:
            for offset in (0, 2):
                async with rls_transaction(pool, _principal(corpus)) as conn:
                    out.append(await SearchPlan(request, settings=settings).run(conn, offset=offset))
        return out

    try:
        together = await results()
        monkeypatch.setattr(windows.Fetched, "covers", lambda self, hits: False)  # read apart, as before
        apart = await results()
    finally:
        await pool.close()
    assert any(r.hits for r in together) and together == apart
    assert any("<mark>" in h["snippet"] for r in together for h in r.hits)


def test_the_keyword_statements_row_level_security_plans_as_function_scans_not_inlined_subqueries(owner_url):
    """Issue 33 (migration 0028): the policies' visible sources and granted files are function scans, one node a
    reference, not their bodies inlined into every policy of every table the statement names — PostgreSQL
    initialises and frees the whole generic plan on every call (323 nodes and 183 subplans before, half its
    CPU a search)."""
    sql, _ = bm25_native.build_query(pipeline.Filters(), windows=True)
    names: list[str] = []

    def numbered(match: re.Match) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    with psycopg.connect(connect.conninfo(for_role(owner_url, "kdbl_api"))) as conn:
        plan = [row[0] for row in conn.execute("EXPLAIN (GENERIC_PLAN) " + re.sub(r"%\((\w+)\)s", numbered, sql))]
    nodes = 1 + sum("->" in line for line in plan)
    assert any("Function Scan on kdbl_whole_sources" in line for line in plan)
    assert any("Function Scan on kdbl_grant_files" in line for line in plan)
    assert nodes <= 220, nodes  # 201 when written; 323 with the bodies inlined


def test_folded_keyword_statements_plan_as_written_and_stay_within_psycopgs_cached_length(owner_url):
    """Issue 33 (kdbl_core.db.sql_text): the keyword statements go out folded — comments dropped, whitespace
    folded — so psycopg parses their placeholders once, not on every search (only texts of at most 4,096 bytes
    are cached). Folded, each plans exactly as written (EXPLAIN VERBOSE of its generic plan, as kdbl_api)."""
    statements = [bm25_native.build_query(pipeline.Filters(), windows=True)[0],
                  bm25_native.build_query(pipeline.Filters())[0],
                  bm25_native.build_query(pipeline.Filters(), given_terms=True)[0],
                  lexical.build_query(pipeline.Filters())[0]]

    def explained(conn, sql: str) -> list[str]:
        names: list[str] = []

        def numbered(match: re.Match) -> str:
            if match.group(1) not in names:
                names.append(match.group(1))
            return f"${names.index(match.group(1)) + 1}"

        text = "EXPLAIN (GENERIC_PLAN, VERBOSE, COSTS OFF) " + re.sub(r"%\((\w+)\)s", numbered, sql)
        return [row[0] for row in conn.execute(text)]

    with psycopg.connect(connect.conninfo(for_role(owner_url, "kdbl_api"))) as conn:
        for sql in statements:
            folded = sql_text.fold(sql)
            assert len(folded.encode()) <= MAX_CACHED_STATEMENT_LENGTH < len(sql.encode()) or sql is statements[-1]
            assert "--" not in folded and "\n" not in folded and sql_text.fold(folded) == folded
            assert explained(conn, folded) == explained(conn, sql)
