"""`kdbl-control bench vectors`: the vector arm on a `bench scale` tenant (issue 19): the served HNSW index's
size and build parameters, ef_search against recall, iterative scans under RLS, and quantised indexes.

Runs on an existing database holding the tenant `bench scale` wrote (random unit vectors of the model's
dimension: no cluster structure, the worst case for a graph index, so recall here is a floor). Every query
runs as the kdbl_api role in an RLS transaction with the served SQL (kdbl_core.search.vector); the reference
is the same SQL with index scans disabled, which an EXPLAIN checks for every kind of query: the exact top-k
of the same visible rows. Query vectors are the dataset's queries embedded by the real model (as the API
does) and random unit vectors.

- Served index: pg_relation_size, bytes per indexed vector, m / ef_construction (reloptions or pgvector's
  defaults 16 / 64), against shared_buffers. The build time is `bench scale`'s (hnsw_build_s); it is not
  rebuilt here.
- ef_search in 40, 64, 100, 200, 400 at k = 10 and k = 100 (the hybrid depth; the API sets ef_search
  2 x depth = 200 and iterative_scan relaxed_order): recall@k against exact, p50/p95.
- Restricted principals: the source made `restricted` and every n-th file granted to one subject, so the
  principal sees ~1% or ~10% of the chunks through RLS (files granted one by one: kdbl_grant_files), all inside one transaction that
  is rolled back (nothing is written); iterative_scan relaxed_order against off (off stops at ef_search
  candidates, so it returns fewer than k), recall against exact under the same RLS.
- Quantisation (skippable: it builds indexes): an HNSW index on binary_quantize(embedding)::bit(D) (Hamming) whose top N are re-ranked by exact cosine; build time, size,
  recall@10 against exact and whether it keeps >= 0.98, beside the served full-precision index in the same
  shape (top N, exact re-rank). Built with maintenance_work_mem as `bench scale` builds the served one, and
  dropped at the end, also after an error or Ctrl-C (and at the start, should a killed run have left them).

Measured at 100k (docs/benchmarks.md): the served setting's recall@100 is 0.196 on these random vectors;
halfvec matched the full index at 57% of its size; nothing reaches 0.98. Since migration 0020 the column
and the served index are halfvec themselves ("halfvec" in the table: the served index, not rebuilt), so
full precision is no longer among the candidates. The exact reference dominates the
run time (326 ms a query at 100k, ~10x that at 1M): --queries / --random-queries set its cost.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from pgvector import Vector
from pgvector.psycopg import register_vector_async
from psycopg.rows import namedtuple_row

from kdbl_control import bench_scale
from kdbl_control.beir import load_queries
from kdbl_control.bench import pct
from kdbl_core.access.principal import Principal, principal_params, rls_transaction
from kdbl_core.db.async_pool import Connection, named_rows
from kdbl_core.db.connect import async_pool, conninfo
from kdbl_core.db.urls import for_role
from kdbl_core.embedder import Embedder
from kdbl_core.errors import ConfigError
from kdbl_core.search import vector
from kdbl_core.search.lexical import Filters

EF_SEARCH = (40, 64, 100, 200, 400)
DEPTHS = (10, 100)  # a page of hits; the hybrid depth (KDBL_HYBRID_DEPTH) every search runs the arm at
SHARES = (0.01, 0.10)  # of the tenant's files a restricted principal is granted
CANDIDATES = (10, 40, 100, 200)  # an index's top N, re-ranked by exact cosine, for recall@10
MAINTENANCE_WORK_MEM = "4GB"  # as bench_scale.maintain builds the served index
HNSW_DEFAULTS = {"m": 16, "ef_construction": 64}  # pgvector's, when the index has no reloptions
RECALL_TARGET = 0.98  # issue 19: a quantised index must keep recall@10 >= 0.98 of exact
CORPUS_NOTE = ("corpus vectors are random unit vectors (no cluster structure: the worst case for HNSW, so "
               "these recalls are a floor for real embeddings)")

Log = Callable[[str], None]


def served_ef(limit: int) -> int:
    """hnsw.ef_search the API sets for an arm of `limit` rows (kdbl_core.search.vector / pipeline)."""
    return min(1000, max(64, 2 * limit))


def recall(found: Sequence[int], exact: Sequence[int], k: int) -> float:
    """Share of the exact top k (or of all exact hits, when fewer) that `found`'s top k holds."""
    truth = set(exact[:k])
    return len(truth & set(found[:k])) / len(truth) if truth else 1.0


def random_unit_vectors(n: int, dim: int, seed: int = 19) -> list[list[float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        v = [rng.gauss(0.0, 1.0) for _ in range(dim)]
        norm = math.sqrt(sum(x * x for x in v))
        out.append([x / norm for x in v])
    return out


def _timing(ms: list[float]) -> dict[str, Any]:
    return {"p50_ms": pct(ms, 0.5), "p95_ms": pct(ms, 0.95)} if ms else {"p50_ms": None, "p95_ms": None}


def _index_names(plan: Any) -> Iterator[str]:
    """Every index an EXPLAIN (FORMAT JSON) plan reads."""
    if isinstance(plan, dict):
        if "Index Name" in plan:
            yield plan["Index Name"]
        for value in plan.values():
            yield from _index_names(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _index_names(value)


async def _plan_indexes(conn: Connection, sql: str, params: dict) -> list[str]:
    [row] = await (await conn.execute("EXPLAIN (FORMAT JSON) " + sql, params)).fetchall()
    return sorted(set(_index_names(row[0])))


# ------------------------------------------------------------------------------------------ the facts

_HNSW_INDEXES = """
SELECT c.relname AS name, coalesce(c.reloptions, '{}') AS options, pg_relation_size(c.oid) AS bytes
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
 WHERE a.amname = 'hnsw' AND i.indrelid = 'public.chunks'::regclass
"""


def _options(reloptions: Sequence[str]) -> dict[str, int]:
    opts = dict(HNSW_DEFAULTS)
    for item in reloptions:
        key, _, value = item.partition("=")
        if key in opts:
            opts[key] = int(value)
    return opts


def environment(owner_url: str, tenant: str, dim: int, model_id: str) -> dict[str, Any]:
    """pgvector's version, the memory settings, the tenant's vectors and the served index's facts."""
    with psycopg.connect(conninfo(owner_url), row_factory=namedtuple_row) as conn:
        row = conn.execute("SELECT id FROM tenants WHERE name = %(n)s", {"n": tenant}).fetchone()
        if row is None:
            raise ConfigError(f"no tenant {tenant!r} here: build one with `kdbl-control bench scale`")
        tenant_id = row.id
        [version] = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        [shared] = conn.execute("SELECT pg_size_bytes(current_setting('shared_buffers'))").fetchone()
        [vectors, sources] = conn.execute(
            f"SELECT count(*), array_agg(DISTINCT source_id) FROM chunks WHERE tenant_id = %(t)s "
            f"AND embedding_model = %(m)s AND vector_dims(embedding) = {int(dim)}",
            {"t": tenant_id, "m": model_id}).fetchone()
        [indexed] = conn.execute(f"SELECT count(*) FROM chunks WHERE vector_dims(embedding) = {int(dim)}"
                                 ).fetchone()
        indexes = {r.name: r for r in conn.execute(_HNSW_INDEXES)}
        conn.execute("SELECT '[1]'::vector <=> '[1]'::vector")  # loads pgvector: its settings become visible
        settings = conn.execute("SELECT current_setting('hnsw.max_scan_tuples', true) AS max_scan_tuples, "
                                "current_setting('hnsw.scan_mem_multiplier', true) AS scan_mem_multiplier"
                                ).fetchone()._asdict()
    if not vectors:
        raise ConfigError(f"tenant {tenant!r} has no {dim}-d vectors of {model_id}")
    name = f"chunks_embedding_{int(dim)}_hnsw"
    served = indexes.get(name)
    if served is None:
        raise ConfigError(f"no served HNSW index {name}: run `kdbl-control bench scale` (it builds it)")
    index = {"name": name, "bytes": served.bytes, "indexed_vectors": indexed,
             "bytes_per_vector": round(served.bytes / max(indexed, 1), 1), **_options(served.options),
             "share_of_shared_buffers": round(served.bytes / shared, 2),
             "build_s": "see bench scale's hnsw_build_s (not rebuilt here)"}
    return {"tenant_id": tenant_id, "source_ids": sources, "pgvector": version, "vectors": vectors,
            "shared_buffers_bytes": shared, "maintenance_work_mem_for_builds": MAINTENANCE_WORK_MEM,
            "pgvector_settings": settings, "served_index": index,
            "iterative_scan_supported": tuple(int(p) for p in version.split(".")[:2]) >= (0, 8),
            "quantisation_supported": tuple(int(p) for p in version.split(".")[:2]) >= (0, 7)}


# ---------------------------------------------------------------------- served arm: ef_search x depth

async def _tune(conn: Connection, *, ef: int, iterative: str, exact: bool = False) -> None:
    await conn.execute("SELECT set_config('hnsw.ef_search', %(ef)s, true), "
                       "set_config('hnsw.iterative_scan', %(it)s, true), "
                       "set_config('enable_indexscan', %(scan)s, true)",
                       {"ef": str(ef), "it": iterative, "scan": "off" if exact else "on"})


async def _search(conn: Connection, qv: list[float], model_id: str, k: int) -> tuple[list[int], list[int]]:
    hits = await vector.search(conn, qv, model_id, Filters(), limit=k, tuned=True)
    return [h.chunk_id for h in hits], [h.file_id for h in hits]


def _exact_query(qv: list[float], model_id: str, k: int) -> tuple[str, dict]:
    """The served SQL under its own text: psycopg prepares a statement run often, and a plan cached with
    index scans off would be reused by the served query (measured: every served run took the exact 330 ms
    at 100k chunks until the texts differed)."""
    sql, params = vector.build_query(len(qv), Filters())
    params.update({"q": Vector(qv), "model": model_id, "limit": k})
    return sql + "/* exact reference: index scans off */", params


async def _exact(conn: Connection, qv: list[float], model_id: str, k: int) -> list[int]:
    sql, params = _exact_query(qv, model_id, k)
    return [r.chunk_id for r in await (await conn.execute(sql, params)).fetchall()]


async def _exact_plan(conn: Connection, qv: list[float], model_id: str, k: int) -> list[str]:
    """The indexes the reference query reads: none of them may be an HNSW index."""
    return await _plan_indexes(conn, *_exact_query(qv, model_id, k))


async def ef_sweep(owner_url: str, principal: Principal, vectors: dict[str, list[list[float]]], model_id: str,
                   hnsw_names: set[str], log: Log) -> dict[str, Any]:
    """Exact top-k of every query vector, then recall@k and latency of the served query per ef_search."""
    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=1, name="kdbl-bench-vectors")
    depth, out = max(DEPTHS), {"exact": {}, "sweep": []}
    try:
        exact: dict[str, list[list[int]]] = {}
        for kind, qvs in vectors.items():
            ms, exact[kind] = [], []
            for i, qv in enumerate(qvs):
                start = time.perf_counter()
                async with rls_transaction(pool, principal) as conn:
                    await _tune(conn, ef=40, iterative="off", exact=True)
                    if i == 0:
                        used = await _exact_plan(conn, qv, model_id, depth)
                        if set(used) & hnsw_names:
                            raise AssertionError(f"the exact reference reads an HNSW index: {used}")
                    ids = await _exact(conn, qv, model_id, depth)
                ms.append((time.perf_counter() - start) * 1000)
                exact[kind].append(ids)
                if (i + 1) % 25 == 0:
                    log(f"vectors: exact top {depth} of {i + 1}/{len(qvs)} {kind} queries")
            out["exact"][kind] = {"queries": len(qvs), "k": depth, "plan_indexes": used, **_timing(ms)}
            log(f"vectors: exact {kind}: {json.dumps(out['exact'][kind])}")
        for kind, qvs in vectors.items():
            for k in DEPTHS:
                for ef in EF_SEARCH:
                    ms, recalls, returned = [], [], []
                    for qv, truth in zip(qvs, exact[kind], strict=True):
                        start = time.perf_counter()
                        async with rls_transaction(pool, principal) as conn:
                            await _tune(conn, ef=ef, iterative="relaxed_order")
                            ids, _ = await _search(conn, qv, model_id, k)
                        ms.append((time.perf_counter() - start) * 1000)
                        recalls.append(recall(ids, truth, k))
                        returned.append(len(ids))
                    row = {"queries": kind, "k": k, "ef_search": ef,
                           "served": ef == served_ef(depth) and k == depth,
                           "recall": round(sum(recalls) / len(recalls), 4),
                           "min_recall": round(min(recalls), 4),
                           "mean_returned": round(sum(returned) / len(returned), 1), **_timing(ms)}
                    out["sweep"].append(row)
                    log(f"vectors: {json.dumps(row)}")
    finally:
        await pool.close()
    out["exact_ids"] = exact  # for the quantised indexes' recall; dropped from the report
    return out


# ------------------------------------------------------------- restricted principals (rolled back)

_GRANT_EVERY_NTH = """
INSERT INTO grants (tenant_id, source_id, file_key, subject)
SELECT f.tenant_id, f.source_id, f.key, %(subject)s
  FROM (SELECT tenant_id, source_id, key, row_number() OVER (ORDER BY id) AS n
          FROM files WHERE tenant_id = %(t)s AND source_id = ANY(%(sources)s)) f
 WHERE f.n %% %(step)s = 0
"""


async def restricted(owner_url: str, tenant_id: uuid.UUID, tenant: str, source_ids: list[uuid.UUID],
                     vectors: dict[str, list[list[float]]], model_id: str, hnsw_names: set[str],
                     iterative_modes: Sequence[str], log: Log) -> list[dict[str, Any]]:
    """Principals granted every n-th file (~1% and ~10% of the chunks) of the tenant's sources made
    `restricted`: the served query under RLS with each iterative mode, against exact under the same RLS.
    One owner transaction that is rolled back: the grants and the ACL change are never committed."""
    conn = await psycopg.AsyncConnection.connect(conninfo(owner_url), row_factory=named_rows)
    await register_vector_async(conn)
    rows = []
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("UPDATE sources SET acl_mode = 'restricted' WHERE id = ANY(%(s)s)",
                               {"s": source_ids})
            subjects = {}
            for share in SHARES:
                subject = f"user:bench-vectors-{share:g}"
                await conn.execute(_GRANT_EVERY_NTH, {"subject": subject, "t": tenant_id,
                                                      "sources": source_ids, "step": round(1 / share)})
                subjects[share] = subject
            await conn.execute("ANALYZE grants")
            await conn.execute("SET LOCAL ROLE kdbl_api")
            for share, subject in subjects.items():
                principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject=subject)
                await conn.execute("SELECT set_config('kdbl.tenant_id', %(tenant)s, true), "
                                   "set_config('kdbl.subjects', %(subjects)s, true)",
                                   principal_params(principal))
                [visible, allowed] = await (await conn.execute(
                    "SELECT count(*), array_agg(DISTINCT file_id) FROM chunks WHERE embedding_model = %(m)s",
                    {"m": model_id})).fetchone()
                allowed = set(allowed or ())
                for kind, qvs in vectors.items():
                    exact, exact_ms, depth = [], [], max(DEPTHS)
                    for i, qv in enumerate(qvs):
                        await _tune(conn, ef=served_ef(depth), iterative="off", exact=True)
                        if i == 0:
                            used = await _exact_plan(conn, qv, model_id, depth)
                            if set(used) & hnsw_names:
                                raise AssertionError(f"the exact reference reads an HNSW index: {used}")
                        start = time.perf_counter()
                        exact.append(await _exact(conn, qv, model_id, depth))
                        exact_ms.append((time.perf_counter() - start) * 1000)
                    for k in DEPTHS:
                        for mode in iterative_modes:
                            ms, recalls, returned, outside = [], [], [], 0
                            for qv, truth in zip(qvs, exact, strict=True):
                                await _tune(conn, ef=served_ef(k), iterative=mode)
                                start = time.perf_counter()
                                ids, files = await _search(conn, qv, model_id, k)
                                ms.append((time.perf_counter() - start) * 1000)
                                recalls.append(recall(ids, truth, k))
                                returned.append(len(ids))
                                outside += sum(f not in allowed for f in files)
                            row = {"principal": f"granted every {round(1 / share)}th file", "share": share,
                                   "visible_vectors": visible, "queries": kind, "k": k,
                                   "ef_search": served_ef(k),
                                   "iterative_scan": mode, "recall": round(sum(recalls) / len(recalls), 4),
                                   "mean_returned": round(sum(returned) / len(returned), 1),
                                   "short_share": round(sum(n < min(k, visible) for n in returned)
                                                        / len(returned), 4),
                                   "outside_grants": outside, **_timing(ms),
                                   "exact": {"k": depth, "plan_indexes": used, **_timing(exact_ms)}}
                            rows.append(row)
                            log(f"vectors: restricted {json.dumps(row)}")
                log(f"vectors: restricted principal {share:.0%} done")
    finally:
        await conn.close()
    return rows


# ---------------------------------------------------------------------------------------- quantisation

def quantised_indexes(dim: int) -> dict[str, tuple[str, str, str]]:
    """method -> (index name, indexed expression with its operator class, ORDER BY of the candidates)."""
    d = int(dim)
    return {
        "binary": (f"chunks_bench_binary_{d}_hnsw", f"(binary_quantize(embedding)::bit({d})) bit_hamming_ops",
                   f"binary_quantize(c.embedding)::bit({d}) <~> binary_quantize(CAST(%(q)s AS vector({d})))"),
    }


def _quantised_query(dim: int, order: str) -> str:
    """The served arm's shape with the quantised distance picking `candidates`, re-ranked by exact cosine."""
    d = int(dim)
    return f"""
WITH cand AS (
    SELECT c.id, c.embedding FROM chunks c
     WHERE c.tenant_id = kdbl_tenant() AND vector_dims(c.embedding) = {d} AND c.embedding_model = %(model)s
       AND c.source_id IN (SELECT s.id FROM sources s JOIN tenants t ON t.id = s.tenant_id
                            WHERE s.hybrid_enabled AND t.hybrid_enabled)
     ORDER BY {order}
     LIMIT %(candidates)s
)
SELECT id FROM cand ORDER BY embedding::vector({d}) <=> CAST(%(q)s AS vector({d})), id LIMIT %(k)s
"""


def drop_quantised(owner_url: str, dim: int) -> None:
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        for name, _, _ in quantised_indexes(dim).values():
            conn.execute(f"DROP INDEX IF EXISTS {name}")


def _build(owner_url: str, name: str, expression: str, dim: int) -> dict[str, Any]:
    notices: list[str] = []
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute(f"SET maintenance_work_mem = '{MAINTENANCE_WORK_MEM}'")
        start = time.perf_counter()
        conn.execute(f"CREATE INDEX {name} ON chunks USING hnsw ({expression}) "
                     f"WHERE vector_dims(embedding) = {int(dim)}")
        seconds = time.perf_counter() - start
        [size] = conn.execute("SELECT pg_relation_size(%(n)s::regclass)", {"n": name}).fetchone()
    return {"index": name, "build_s": round(seconds, 1), "bytes": size, "notices": notices}


async def _quantised_recall(owner_url: str, principal: Principal, qvs: list[list[float]],
                            exact: list[list[int]], model_id: str, dim: int, order: str, index: str,
                            candidates: int) -> dict[str, Any]:
    pool = await async_pool(for_role(owner_url, "kdbl_api"), size=1, name="kdbl-bench-vectors")
    sql, k = _quantised_query(dim, order), 10
    ms, recalls, used = [], [], []
    try:
        for i, (qv, truth) in enumerate(zip(qvs, exact, strict=True)):
            params = {"q": Vector(qv), "model": model_id, "candidates": candidates, "k": k}
            start = time.perf_counter()
            async with rls_transaction(pool, principal) as conn:
                await _tune(conn, ef=served_ef(candidates), iterative="relaxed_order")
                if i == 0:
                    used = await _plan_indexes(conn, sql, params)
                ids = [r.id for r in await (await conn.execute(sql, params)).fetchall()]
            ms.append((time.perf_counter() - start) * 1000)
            recalls.append(recall(ids, truth, k))
    finally:
        await pool.close()
    if index not in used:
        raise AssertionError(f"the quantised query did not read {index}: {used}")
    mean = round(sum(recalls) / len(recalls), 4)
    return {"candidates": candidates, "ef_search": served_ef(candidates), "k": k, "recall": mean,
            "min_recall": round(min(recalls), 4), "keeps_0_98_of_exact": mean >= RECALL_TARGET, **_timing(ms)}


def quantisation(owner_url: str, principal: Principal, vectors: dict[str, list[list[float]]],
                 exact: dict[str, list[list[int]]], model_id: str, dim: int, served: dict[str, Any],
                 log: Log) -> list[dict[str, Any]]:
    """Build each quantised index, measure recall@10 against exact, drop them all (also on error/Ctrl-C);
    then the served full-precision index in the same shape (top N, exact re-rank), the like-for-like
    reference: on random vectors no graph index reaches 0.98, so the loss quantisation adds is the number."""
    out = []
    d = int(dim)
    methods = [(method, *spec) for method, spec in quantised_indexes(dim).items()]
    full = f"c.embedding::halfvec({d}) <=> CAST(%(q)s AS halfvec({d}))"  # the served index's expression (0020)
    methods.append(("halfvec", served["name"], None, full))
    drop_quantised(owner_url, dim)  # a killed run's leftovers
    try:
        for method, name, expression, order in methods:
            if expression is None:
                built = {"index": name, "build_s": None, "bytes": served["bytes"], "notices": []}
            else:
                log(f"vectors: building the {method} index {name} ...")
                built = _build(owner_url, name, expression, dim)
            built["bytes_per_vector"] = round(built["bytes"] / max(served["indexed_vectors"], 1), 1)
            log(f"vectors: {json.dumps(built)}")
            for candidates in CANDIDATES:
                for kind, qvs in vectors.items():
                    row = {"method": method, "queries": kind, **built, **asyncio.run(_quantised_recall(
                        owner_url, principal, qvs, [e[:10] for e in exact[kind]], model_id, dim, order, name,
                        candidates))}
                    out.append(row)
                    log(f"vectors: {json.dumps(row)}")
    finally:
        drop_quantised(owner_url, dim)
    return out


# ------------------------------------------------------------------------------------------ the run

def run_vectors_bench(owner_url: str, dataset: Path, *, model_path: Path, tenant: str = bench_scale.TENANT,
                      n_queries: int = 100, n_random: int = 50, quantise: bool = True,
                      log: Log) -> dict[str, Any]:
    with Embedder(model_path, n_threads=2) as embedder:
        dim, model_id = embedder.dim, embedder.model_id
        texts = load_queries(dataset, n_queries) if n_queries else []
        log(f"vectors: embedding {len(texts)} queries")
        vectors = {"dataset": [embedder.embed_query(t) for t in texts]} if texts else {}
    if n_random:
        vectors["random"] = random_unit_vectors(n_random, dim)
    if not vectors:
        raise ConfigError("no query vectors: give --queries or --random-queries")
    env = environment(owner_url, tenant, dim, model_id)
    tenant_id = env.pop("tenant_id")
    source_ids = env.pop("source_ids")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:bench")
    with psycopg.connect(conninfo(owner_url)) as conn:
        hnsw = {r[0] for r in conn.execute(_HNSW_INDEXES)}
    hnsw |= {name for name, _, _ in quantised_indexes(dim).values()}
    log(f"vectors: {env['vectors']:,} vectors of {tenant}, pgvector {env['pgvector']}, "
        f"served index {env['served_index']['bytes'] / 2**20:,.0f} MB")
    arm = asyncio.run(ef_sweep(owner_url, principal, vectors, model_id, hnsw, log))
    exact = arm.pop("exact_ids")
    modes = ("relaxed_order", "off") if env["iterative_scan_supported"] else ("off",)
    limited = asyncio.run(restricted(owner_url, tenant_id, tenant, source_ids, vectors, model_id, hnsw, modes,
                                     log))
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "tenant": tenant, "dimensions": dim, "model": model_id,
        "corpus": CORPUS_NOTE, "query_vectors": {kind: len(v) for kind, v in vectors.items()}, **env,
        "served_setting": {"k": max(DEPTHS), "ef_search": served_ef(max(DEPTHS)),
                           "iterative_scan": "relaxed_order"},
        "exact": arm["exact"], "ef_search_sweep": arm["sweep"], "restricted": limited}
    if not quantise:
        result["quantisation"] = "skipped (--no-quantisation)"
    elif not env["quantisation_supported"]:
        result["quantisation"] = f"skipped: pgvector {env['pgvector']} has no halfvec / binary_quantize"
    else:
        result["quantisation"] = quantisation(owner_url, principal, vectors, exact, model_id, dim,
                                              env["served_index"], log)
    return result


def _pair(row: dict[str, Any]) -> str:
    return f"{row['p50_ms']} / {row['p95_ms']}"


def summarise(result: dict[str, Any]) -> str:
    index = result["served_index"]
    lines = [f"{result['vectors']:,} vectors ({result['dimensions']}-d, {result['model']}) of tenant "
             f"{result['tenant']}; pgvector {result['pgvector']}; {result['corpus']}",
             f"served index {index['name']}: {index['bytes'] / 2**20:,.1f} MB, "
             f"{index['bytes_per_vector']:,} B per vector, m {index['m']}, ef_construction "
             f"{index['ef_construction']}, {index['share_of_shared_buffers']}x shared_buffers "
             f"({result['shared_buffers_bytes'] / 2**20:,.0f} MB); "
             f"build time: bench scale's hnsw_build_s; hnsw.max_scan_tuples "
             f"{result['pgvector_settings']['max_scan_tuples']}",
             "exact reference (index scans off, checked by EXPLAIN): " + ", ".join(
                 f"{kind} p50 / p95 {_pair(e)} ms" for kind, e in result["exact"].items()),
             "", "| queries | k | ef_search | recall@k | min | p50 / p95 ms |", "|---|---|---|---|---|---|"]
    for r in result["ef_search_sweep"]:
        mark = " (served)" if r["served"] else ""
        lines.append(f"| {r['queries']} | {r['k']} | {r['ef_search']}{mark} | {r['recall']:.4f} "
                     f"| {r['min_recall']:.2f} | {_pair(r)} |")
    lines += ["", "restricted principals (RLS, per-file grants; rolled back):",
              "| share | visible | queries | k | iterative_scan | returned | short of k | recall@k "
              "| p50 / p95 ms | exact p50 ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["restricted"]:
        lines.append(f"| {r['share']:.0%} | {r['visible_vectors']:,} | {r['queries']} | {r['k']} "
                     f"| {r['iterative_scan']} | {r['mean_returned']} | {r['short_share']:.0%} "
                     f"| {r['recall']:.4f} | {_pair(r)} | {r['exact']['p50_ms']} |")
    q = result["quantisation"]
    if isinstance(q, str):
        lines += ["", f"quantisation: {q}"]
    else:
        lines += ["", f"quantisation (maintenance_work_mem {result['maintenance_work_mem_for_builds']}; "
                  f"indexes dropped after): recall@10 vs exact, target >= {RECALL_TARGET}",
                  "| method | queries | candidates | build s | MB | B/vector | recall@10 | >= 0.98 "
                  "| p50 / p95 ms |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in q:
            lines.append(f"| {r['method']} | {r['queries']} | {r['candidates']} | {r['build_s'] or 'served'} "
                         f"| {r['bytes'] / 2**20:,.1f} | {r['bytes_per_vector']:,} | {r['recall']:.4f} "
                         f"| {'yes' if r['keeps_0_98_of_exact'] else 'no'} | {_pair(r)} |")
        notices = sorted({n for r in q for n in r["notices"]})
        if notices:
            lines.append("build notices: " + "; ".join(notices))
    return "\n".join(lines)
