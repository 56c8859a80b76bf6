"""`kdbl-control bench entity-graph`: the entity graph at scale (issue 31) — what the worker's stage costs,
what the graph weighs, how fast find_entity answers.

A generated folder of business prose (`files` files of `chunks` chunks each; company, person and place names
drawn with a Zipf skew, so a few are named in thousands of chunks, as in real archives) is crawled by the
worker's own pipeline into a source with `entities: true`, twice timed: the crawl alone, then the
background stage (kdbl_worker.entity_stage) reading every chunk's entities. Then: the graph's bytes a chunk
(entities, mentions and relations with their indexes; the prose names ~5 entities a 900-character chunk,
near the ~3.6 of the docs corpus) and find_entity's core (resolve + neighbourhood under
row-level security, kdbl_core.search.entity_graph) for `queries` names in each response mode, p50 / p95, for
names drawn by how often they are named (the much-named ones come up most), for names drawn alike (the
typical entity), and for the most-named entity. Last, search mode graph (the whole pipeline: the keyword and
entity arms fused, windows and snippets; 20 hits) beside lexical, the reference, on the same questions
("what did <name> acquire", names drawn by frequency), in one run.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

from kdbl_control import admin, compose
from kdbl_control.ir_metrics import percentile
from kdbl_core.access.principal import Principal, rls_transaction
from kdbl_core.db.connect import async_pool, sync_pool
from kdbl_core.db.urls import for_role
from kdbl_core.search import entity_graph, pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.settings import Settings

_SYLLABLES = "ac me ni tech glo bex hoo li um bre lla ini so vo ra ka zen tri ton mar lex cor vi da na po qui".split()
_SUFFIXES = ("Corp.", "Inc.", "GmbH", "plc", "Group", "Holdings", "Systems", "Labs")
_GIVEN = ("Maria", "John", "Anna", "Peter", "Laura", "David", "Sofia", "Thomas", "Elena", "Michael", "Sarah", "Kenji")
_SURNAMES = ("Rossi", "Smith", "Weber", "Novak", "Garcia", "Tanaka", "Dubois", "Larsen", "Kowalski", "Silva")
_PLACES = ("Zurich", "Lisbon", "Berlin", "Paris", "New York", "Tokyo", "Madrid", "Vienna", "Oslo", "Chicago")
_TEMPLATES = (
    "{org} acquired {org2} for ${n} million in March {year}.",
    "{person}, chief executive of {org}, said demand in {place} grew.",
    "{org} opened an office in {place} and signed an agreement with {org2}.",
    "{org} competes with {org2} in {place}.",
    "Revenue at {org} rose {n} percent in fiscal year {year}, according to {person}.",
    "The committee reviewed the quarterly figures and the outlook for the coming months.",
    "Operating costs fell while the backlog of orders remained stable across all regions.",
    "Management expects margins to improve as supply constraints ease over the next quarters.",
    "The board approved the dividend policy and the share buyback programme without changes.",
    "Customer retention improved, and the pipeline of new contracts grew in every segment.",
    "Capital expenditure focused on maintenance, automation and the replacement of older equipment.",
    "Risks include currency movements, higher interest rates and delays in regulatory approvals.",
)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize() + " " + rng.choice(_SUFFIXES)


def make_corpus(root: Path, files: int, chunks: int, seed: int = 31) -> None:
    """`files` text files of ~`chunks` chunks of ~900 characters each."""
    rng = random.Random(seed)
    orgs = [_name(rng) for _ in range(3000)]
    people = [f"{g} {s}" for g in _GIVEN for s in _SURNAMES]
    weights = [1 / (i + 1) for i in range(len(orgs))]  # Zipf: the first names come up most
    root.mkdir(parents=True)
    for f in range(files):
        paragraphs = []
        for _ in range(chunks):
            sentences = []
            while sum(len(s) for s in sentences) < 850:
                org, org2 = rng.choices(orgs, weights, k=2)
                sentences.append(rng.choice(_TEMPLATES).format(
                    org=org, org2=org2, person=rng.choice(people), place=rng.choice(_PLACES),
                    n=rng.randint(2, 900), year=rng.randint(2015, 2025)))
            paragraphs.append(" ".join(sentences))
        (root / f"report-{f:05d}.txt").write_text("\n\n".join(paragraphs))


async def _queries(api_url: str, tenant_id: Any, tenant: str, names: list[str], modes: dict[str, tuple]) -> dict:
    pool = await async_pool(api_url, size=1, name="kdbl-bench-entity-graph")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:bench")
    out: dict[str, Any] = {}
    try:
        for mode, (related, edges, evidence, top) in modes.items():
            ms = []
            for name in [*names[:3], *names]:  # the first three warm the plans
                started = time.perf_counter()
                async with rls_transaction(pool, principal) as conn:
                    entity = await entity_graph.resolve(conn, name, None)
                    await entity_graph.neighbourhood(conn, entity, related=related, edges=edges, evidence=evidence,
                                                     top_chunks=top)
                ms.append((time.perf_counter() - started) * 1000)
            ms = ms[3:]
            out[mode] = {"p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
                         "max_ms": round(max(ms), 2), "queries": len(ms)}
    finally:
        await pool.close()
    return out


async def _searches(api_url: str, tenant_id: Any, tenant: str, names: list[str]) -> dict[str, Any]:
    """search p50 / p95 per mode, lexical and graph in turns (the same questions, the same load)."""
    pool = await async_pool(api_url, size=1, name="kdbl-bench-entity-graph")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:bench")
    settings = Settings()
    times: dict[str, list[float]] = {"lexical": [], "graph": []}
    served: dict[str, int] = {}
    try:
        for i, name in enumerate([*names[:3], *names]):  # the first three warm the plans
            for mode in times:
                request = pipeline.SearchRequest(query=f"what did {name} acquire", mode=mode, limit=20)
                started = time.perf_counter()
                async with rls_transaction(pool, principal) as conn:
                    result = await SearchPlan(request, settings=settings).run(conn)
                if i >= 3:
                    times[mode].append((time.perf_counter() - started) * 1000)
                    served[result.mode] = served.get(result.mode, 0) + 1
    finally:
        await pool.close()
    out: dict[str, Any] = {mode: {"p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
                                  "queries": len(ms)} for mode, ms in times.items()}
    out["served"] = served
    return out


def run_entity_graph_bench(owner_url: str, work_dir: Path, *, files: int, chunks: int, n_queries: int,
                           log: Any) -> dict[str, Any]:
    folder = work_dir / "corpus"
    shutil.rmtree(folder, ignore_errors=True)
    make_corpus(folder, files, chunks)
    result: dict[str, Any] = {"files": files}
    with sync_pool(owner_url, size=2) as owner, sync_pool(for_role(owner_url, "kdbl_worker"), size=6) as worker:
        tenant = f"bench-entities-{os.urandom(3).hex()}"
        t = admin.create_tenant(owner, tenant)
        s = admin.add_source(owner, tenant, protocol="fs", config={"root": str(folder), "entities": True},
                             name="reports")
        [source] = compose.load_sources(worker, source_id=s.id)
        started = time.perf_counter()
        stats = compose.indexer(worker, Settings()).crawl(source)
        crawl_s = time.perf_counter() - started
        log(f"entity-graph: crawled {stats.indexed} files, {stats.chunks} chunks in {crawl_s:.1f} s")
        started = time.perf_counter()
        read = compose.extract_entities(worker)
        stage_s = time.perf_counter() - started
        log(f"entity-graph: entities of {read} files read in {stage_s:.1f} s")
        with owner.connection() as conn:
            conn.commit()
            conn.autocommit = True  # VACUUM runs outside a transaction
            conn.execute("VACUUM (ANALYZE) entities, entity_mentions, entity_relations, files, chunks")
            conn.autocommit = False
            size = conn.execute(
                "SELECT (SELECT count(*) FROM chunks WHERE source_id = %(s)s) AS chunks, "
                "pg_total_relation_size('entities') + pg_total_relation_size('entity_mentions') "
                "+ pg_total_relation_size('entity_relations') AS bytes, "
                "(SELECT count(*) FROM entities WHERE tenant_id = %(t)s) AS entities, "
                "(SELECT count(*) FROM entity_mentions WHERE source_id = %(s)s) AS mentions, "
                "(SELECT count(*) FROM entity_relations WHERE source_id = %(s)s) AS relations",
                {"s": s.id, "t": t.id}).fetchone()
            ranked = [r.name for r in conn.execute(
                "SELECT e.name FROM entities e JOIN entity_mentions m ON m.entity_id = e.id WHERE e.tenant_id = %(t)s "
                "AND e.type = 'ORG' GROUP BY e.id ORDER BY count(*) DESC", {"t": t.id})]
    chunks_n = int(size.chunks)
    result.update({
        "chunks": chunks_n, "crawl_s": round(crawl_s, 2), "crawl_chunks_per_s": round(chunks_n / crawl_s, 1),
        "stage_s": round(stage_s, 2), "stage_chunks_per_s": round(chunks_n / stage_s, 1) if stage_s else None,
        "stage_of_crawl": round(stage_s / crawl_s, 2), "entities": int(size.entities), "mentions": int(size.mentions),
        "relations": int(size.relations), "graph_bytes": int(size.bytes),
        "graph_bytes_per_chunk": round(int(size.bytes) / max(chunks_n, 1), 1)})
    rng = random.Random(7)
    asked = rng.choices(ranked, weights=[1 / (i + 1) for i in range(len(ranked))], k=n_queries)  # as users ask
    api = for_role(owner_url, "kdbl_api")
    caps = entity_graph.CAPS  # the tool's own caps per response mode
    result["find_entity"] = asyncio.run(_queries(api, t.id, tenant, asked, caps))
    uniform = rng.sample(ranked, min(len(ranked), n_queries))  # any name alike: the typical entity
    result["find_entity_uniform"] = asyncio.run(_queries(api, t.id, tenant, uniform, caps))
    result["find_entity_most_named"] = asyncio.run(_queries(api, t.id, tenant, ranked[:1] * 10, {"full": caps["full"]}))
    result["most_named"] = ranked[0] if ranked else None
    result["search"] = asyncio.run(_searches(api, t.id, tenant, asked))
    shutil.rmtree(folder, ignore_errors=True)
    result["date"] = time.strftime("%Y-%m-%d %H:%M")
    result["load_average"] = round(os.getloadavg()[0], 2)
    return result


def summarise(result: dict[str, Any]) -> str:
    lines = [f"entity graph: {result['files']} files, {result['chunks']:,} chunks; load average {result['load_average']}",
             f"crawl {result['crawl_s']} s ({result['crawl_chunks_per_s']} chunks/s); entity stage {result['stage_s']} s "
             f"({result['stage_chunks_per_s']} chunks/s, {result['stage_of_crawl']}x the crawl's time)",
             f"graph: {result['entities']:,} entities, {result['mentions']:,} mentions, {result['relations']:,} relations; "
             f"{result['graph_bytes'] / 2**20:.1f} MB = {result['graph_bytes_per_chunk']} bytes a chunk",
             "find_entity (resolve + neighbourhood under RLS), p50 / p95 / max ms:",
             f"  {'mode':<9}{'names drawn by frequency':>28}{'any name alike':>26}"]
    for mode, row in result["find_entity"].items():
        other = result["find_entity_uniform"][mode]
        lines.append(f"  {mode:<9}{row['p50_ms']:>12} / {row['p95_ms']} / {row['max_ms']:<8}"
                     f"{other['p50_ms']:>10} / {other['p95_ms']} / {other['max_ms']}")
    top = result["find_entity_most_named"]["full"]
    lines.append(f"  the most-named entity ({result['most_named']}), full: p50 {top['p50_ms']} ms, max {top['max_ms']} ms")
    search = result["search"]
    lines.append(f"search 'what did <name> acquire', 20 hits, p50 / p95 ms: lexical {search['lexical']['p50_ms']} / "
                 f"{search['lexical']['p95_ms']}, graph {search['graph']['p50_ms']} / {search['graph']['p95_ms']} "
                 f"(served as {search['served']})")
    return "\n".join(lines)
