"""`kdbl-control bench permissions`: what permissions from the share cost (issue 30), on one generated folder.

The folder: `files` small text files in nested folders, owners, groups and bits drawn at random (seeded; a
POSIX ACL on every fifth file), words from a small vocabulary so searches hit many files. It is indexed
twice, as two sources of two tenants: once open to the tenant (`tenant`) and once `from-source`. Measured:

- crawl: files/s of each first crawl (the worker's own pipeline, in this process), and of a re-crawl of the
  unchanged folder (the listing alone: what every scheduled crawl costs);
- sync: after one file's bits change (no content change), the seconds of the crawl that makes it visible
  to a principal who could not read it, checked under row-level security;
- search: the keyword arm under row-level security (kdbl_core.search.bm25_topk, as search_content runs it)
  for a principal who reads about half the files, against the same folder open to the tenant: p50 / p95 of
  `queries` searches each, over the writers' own generations of the lists and again after a full build
  (one generation per partition: per permission set for from-source, migration 0024).

Needs root (the folder's files are given owners); the users are numeric ids mapped by a permission map.
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
from kdbl_core.content import bm25_lists
from kdbl_core.db.connect import async_pool, sync_pool
from kdbl_core.db.urls import for_role
from kdbl_core.errors import ConfigError
from kdbl_core.search import bm25_topk, lexical
from kdbl_core.settings import Settings

USERS = {5301: "alice", 5302: "bob", 5303: "carol"}
GROUPS = {6301: "eng", 6302: "ops"}
MEMBERS = {"alice": ["eng"], "bob": ["eng", "ops"], "carol": []}
WORDS = ("quarterly revenue forecast audit budget pipeline roadmap incident review contract renewal vendor "
         "migration latency capacity hiring onboarding security compliance retention churn margin").split()
FILE_MODES = (0o644, 0o640, 0o600, 0o604, 0o440)
FOLDER_MODES = (0o755, 0o750, 0o711)


def make_share(root: Path, files: int, seed: int = 30) -> None:
    rng = random.Random(seed)
    root.mkdir(parents=True)
    root.chmod(0o755)
    folders = [root]
    for n in range(max(1, files // 50)):
        folder = rng.choice(folders) / f"d{n}"
        folder.mkdir()
        folders.append(folder)
    for n in range(files):
        path = rng.choice(folders) / f"f{n}.txt"
        path.write_text(" ".join(rng.choices(WORDS, k=80)))
    for path in sorted(root.rglob("*"), reverse=True):
        os.chown(path, rng.choice(list(USERS)), rng.choice(list(GROUPS)))
        path.chmod(rng.choice(FOLDER_MODES if path.is_dir() else FILE_MODES))
        if path.is_file() and rng.random() < 0.2:  # user:carol may read it, whatever the bits say
            acl = [(0x01, 6, 0xFFFFFFFF), (0x02, 4, 5303), (0x04, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF),
                   (0x20, 0, 0xFFFFFFFF)]
            os.setxattr(path, "system.posix_acl_access",
                        (2).to_bytes(4, "little") + b"".join(t.to_bytes(2, "little") + p.to_bytes(2, "little")
                                                             + i.to_bytes(4, "little") for t, p, i in acl))


def _crawl(worker_pool: Any, settings: Settings, source_id: Any) -> tuple[float, Any]:
    [source] = compose.load_sources(worker_pool, source_id=source_id)
    started = time.perf_counter()
    stats = compose.indexer(worker_pool, settings).crawl(source)
    return time.perf_counter() - started, stats


async def _searches(api_url: str, tenant_id: Any, tenant: str, user: str, queries: list[str]) -> dict[str, Any]:
    pool = await async_pool(api_url, size=1, name="kdbl-bench-permissions")
    principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject=f"user:{user}",
                          groups=tuple(MEMBERS[user]))
    ms, hits = [], []
    try:
        for query in [*queries[:5], *queries]:  # the first five warm the connection and plans
            started = time.perf_counter()
            async with rls_transaction(pool, principal) as conn:
                found = await bm25_topk.search(conn, query, lexical.Filters(), limit=21, ts_config="english")
            ms.append((time.perf_counter() - started) * 1000)
            hits.append(len(found))
        async with rls_transaction(pool, principal) as conn:
            [readable] = await (await conn.execute("SELECT count(*) FROM files")).fetchone()
    finally:
        await pool.close()
    ms, hits = ms[5:], hits[5:]
    return {"p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
            "queries": len(ms), "mean_hits": round(sum(hits) / len(hits), 1), "files_readable": int(readable)}


def run_permissions_bench(owner_url: str, work_dir: Path, *, files: int, n_queries: int, log: Any) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise ConfigError("bench permissions gives the generated files owners: run it as root")
    share = work_dir / "share"
    shutil.rmtree(share, ignore_errors=True)
    make_share(share, files)
    names = {**{f"uid:{u}": f"user:{n}" for u, n in USERS.items()}, **{f"gid:{g}": f"group:{n}" for g, n in GROUPS.items()}}
    settings = Settings()
    rng = random.Random(7)
    queries = [" ".join(rng.sample(WORDS, 2)) for _ in range(n_queries)]
    results: dict[str, Any] = {"files": files, "queries": n_queries}
    with sync_pool(owner_url, size=2) as owner, sync_pool(for_role(owner_url, "kdbl_worker"), size=6) as worker:
        for mode in ("tenant", "from-source"):
            tenant = f"bench-perm-{mode}-{os.urandom(3).hex()}"
            t = admin.create_tenant(owner, tenant)
            s = admin.add_source(owner, tenant, protocol="fs", config={"root": str(share)}, name="share",
                                 permissions=mode, permission_map=names if mode == "from-source" else None)
            first, stats = _crawl(worker, settings, s.id)
            log(f"permissions: {mode}: first crawl {stats.indexed} files in {first:.1f} s")
            again, _ = _crawl(worker, settings, s.id)
            row: dict[str, Any] = {"first_crawl_s": round(first, 2), "first_files_per_s": round(stats.indexed / first, 1),
                                   "recrawl_s": round(again, 2), "recrawl_files_per_s": round(files / again, 1)}
            row["search"] = asyncio.run(_searches(for_role(owner_url, "kdbl_api"), t.id, tenant, "alice", queries))
            with owner.connection() as conn:  # the lists as a build leaves them: one generation per partition
                conn.commit()
                built = bm25_lists.build(conn, t.id)
            row["lists_built"] = {k: built.get(k) for k in ("kind", "lists", "postings", "seconds", "skipped") if k in built}
            row["search_built"] = asyncio.run(_searches(for_role(owner_url, "kdbl_api"), t.id, tenant, "alice",
                                                        queries))
            if mode == "from-source":
                row["sync"] = _sync(owner, worker, settings, s.id, share, t.id, tenant, owner_url)
                with owner.connection() as conn:
                    [sets] = conn.execute("SELECT count(DISTINCT permission_set) FROM files WHERE source_id = %s",
                                          (s.id,)).fetchone()
                row["permission_sets"] = int(sets)
            results[mode] = row
            log(f"permissions: {mode}: {row}")
    shutil.rmtree(share, ignore_errors=True)
    results["date"] = time.strftime("%Y-%m-%d %H:%M")
    results["load_average"] = round(os.getloadavg()[0], 2)
    return results


def _sync(owner: Any, worker: Any, settings: Settings, source_id: Any, share: Path, tenant_id: Any, tenant: str,
          owner_url: str) -> dict[str, Any]:
    """One file alice cannot read made world-readable (its folders too): seconds of the crawl after which
    she finds it under row-level security."""
    async def readable() -> set[str]:
        """The keys alice reads, under row-level security (one query)."""
        pool = await async_pool(for_role(owner_url, "kdbl_api"), size=1, name="kdbl-bench-permissions")
        try:
            principal = Principal(tenant_id=tenant_id, tenant_name=tenant, subject="user:alice", groups=("eng",))
            async with rls_transaction(pool, principal) as conn:
                return {r.key for r in await (await conn.execute("SELECT key FROM files")).fetchall()}
        finally:
            await pool.close()

    with owner.connection() as conn:
        keys = [r.key for r in conn.execute("SELECT key FROM files WHERE source_id = %s ORDER BY key", (source_id,))]
    before = asyncio.run(readable())
    hidden = next(k for k in keys if k not in before)
    path = share / hidden
    path.chmod(0o644)
    for folder in path.relative_to(share).parents:
        (share / folder).chmod(0o755)
    if "system.posix_acl_access" in os.listxattr(path):
        os.removexattr(path, "system.posix_acl_access")
    started = time.perf_counter()
    seconds, stats = _crawl(worker, settings, source_id)
    visible = hidden in asyncio.run(readable())
    with owner.connection() as conn:  # files whose permissions changed (the folders' bits reach many)
        [moved] = conn.execute("SELECT count(*) FROM permission_changes WHERE source_id = %s AND job_id = "
                               "(SELECT max(job_id) FROM permission_changes WHERE source_id = %s)",
                               (source_id, source_id)).fetchone()
    return {"file": hidden, "crawl_s": round(seconds, 2), "change_to_effect_s": round(time.perf_counter() - started, 2),
            "reindexed": stats.indexed, "visible_after": visible, "files_changed": int(moved)}


def summarise(result: dict[str, Any]) -> str:
    lines = [f"{result['files']} files, {result['queries']} searches (keyword arm under RLS, principal alice); "
             f"load average {result['load_average']}",
             f"{'permissions':<12}{'1st crawl files/s':>18}{'re-crawl files/s':>17}{'search p50 / p95 ms':>21}"
             f"{'after a build':>17}{'files readable':>15}{'sets':>6}"]
    for mode in ("tenant", "from-source"):
        r = result[mode]
        lines.append(f"{mode:<12}{r['first_files_per_s']:>18}{r['recrawl_files_per_s']:>17}"
                     f"{r['search']['p50_ms']:>12} / {r['search']['p95_ms']:<6}"
                     f"{r['search_built']['p50_ms']:>8} / {r['search_built']['p95_ms']:<6}{r['search']['files_readable']:>15}"
                     f"{r.get('permission_sets', '-'):>6}")
    sync = result["from-source"]["sync"]
    lines.append(f"sync: {sync['file']} made readable on the share -> visible after one crawl of "
                 f"{sync['crawl_s']} s ({sync['reindexed']} files re-read, {sync['files_changed']} files' permissions "
                 f"changed and their chunks moved; visible: {sync['visible_after']})")
    return "\n".join(lines)
