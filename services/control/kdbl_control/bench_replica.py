"""`kdbl-control bench replica`: searches read on a streaming replica beside the same searches on the primary,
the replication lag during a bulk crawl, and the WAL a chunk costs (issue 32).

On the embedded database: a hot standby of it (kdbl_control.standby: pg_basebackup -R, streaming over the
unix socket, hot_standby_feedback on), then
  1. the BEIR corpus (default SciFact) crawled into the primary through the worker's pipeline while the
     primary's view of the standby (pg_stat_replication: replay LSN and replay_lag) is sampled every 0.2 s:
     the lag in bytes and seconds during the load, and how long the standby takes to catch up after it;
  2. WAL bytes a chunk: the primary's WAL position before and after the crawl, over the chunks written;
  3. `kdbl-api` started twice on the same data, reads on the primary (KDBL_DATABASE_URL alone) and reads on
     the standby (KDBL_DATABASE_READ_URL), each measured as `bench search` measures (1 client p50/p95; N
     clients req/s, CPU ms a request of the API, the primary and the standby), result cache off.
On two shared cores the standby competes with the primary for the same CPUs: the point is correctness and the
replica path's overhead (the audit row on the primary, the lag check), not scaling.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from kdbl_control import bench
from kdbl_control.beir import ensure_indexed, load_queries, materialise_beir
from kdbl_control.ir_metrics import percentile
from kdbl_control.proctime import CpuMeter, postmaster_pid
from kdbl_control.standby import Standby, conninfo
from kdbl_control.up import free_port
from kdbl_core.db.embedded_postgres import EmbeddedDatabase
from kdbl_core.settings import get_settings

TENANT = "bench-replica"
_LAG = """SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), r.replay_lsn) AS bytes,
                 extract(epoch FROM r.replay_lag) AS seconds
            FROM pg_stat_replication r LIMIT 1"""


class _LagSampler(threading.Thread):
    """The primary's view of its standby every `interval_s`, until stopped."""

    def __init__(self, owner_url: str, interval_s: float = 0.2) -> None:
        super().__init__(name="kdbl-bench-replica-lag", daemon=True)
        self._url, self._interval = conninfo(owner_url), interval_s
        self._done = threading.Event()
        self.bytes: list[float] = []
        self.seconds: list[float] = []

    def run(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._done.is_set():
                row = conn.execute(_LAG).fetchone()
                if row is not None and row[0] is not None:
                    self.bytes.append(float(row[0]))
                    self.seconds.append(float(row[1] or 0.0))
                self._done.wait(self._interval)

    def finish(self) -> dict[str, Any]:
        self._done.set()
        self.join(timeout=10)
        if not self.bytes:
            return {"samples": 0}
        return {"samples": len(self.bytes), "bytes_p50": round(percentile(self.bytes, 50)),
                "bytes_p95": round(percentile(self.bytes, 95)), "bytes_max": round(max(self.bytes)),
                "seconds_p50": round(percentile(self.seconds, 50), 3),
                "seconds_p95": round(percentile(self.seconds, 95), 3), "seconds_max": round(max(self.seconds), 3)}


def _wal_lsn(owner_url: str) -> str:
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        return conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0]


def _wal_bytes(owner_url: str, since: str) -> int:
    with psycopg.connect(conninfo(owner_url), autocommit=True) as conn:
        return int(conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", (since,)).fetchone()[0])


def _searches(owner_url: str, token: str, queries: list[str], *, clients: int, seconds: float,
              read_url: str | None, pids: dict[str, int | None]) -> dict[str, Any]:
    env = {"KDBL_SEARCH_CACHE_BYTES": "0",
           "KDBL_TENANT_MAX_IN_FLIGHT": str(max(clients, get_settings().tenant_max_in_flight))}
    if read_url:
        env["KDBL_DATABASE_READ_URL"] = read_url
    port = free_port()
    api = bench.start_api(owner_url, port, env)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        return {"http_1_client": asyncio.run(bench.one_client(url, token, queries)),
                "http_n_clients": asyncio.run(bench.many_clients(url, token, queries, clients, seconds,
                                                                 meter=CpuMeter(api=api.pid, **pids)))}
    finally:
        bench.stop_api(api)


def run_replica_bench(db: EmbeddedDatabase, dataset: Path, work_dir: Path, *, clients: int, seconds: float,
                      n_queries: int, log: Any) -> dict[str, Any]:
    owner_url = db.owner_url
    standby = Standby(db, work_dir / "standby")
    standby.destroy()  # a previous run's
    standby.create()
    standby.start()
    try:
        docs = work_dir / "bench-docs"
        n_docs = materialise_beir(dataset, docs)
        log(f"replica: standby streaming; crawling {n_docs} documents into the primary")
        sampler = _LagSampler(owner_url)
        before = _wal_lsn(owner_url)
        sampler.start()
        indexed = ensure_indexed(owner_url, docs, TENANT)
        wal = _wal_bytes(owner_url, before)
        lag = sampler.finish()
        catch_up_s = standby.wait_replayed()
        log(f"replica: {indexed['chunks']} chunks, {wal / 2**20:.1f} MB of WAL; standby caught up in {catch_up_s:.2f} s")
        queries = load_queries(dataset, n_queries)
        pids = {"postgres": postmaster_pid(db.pgdata), "standby": standby.process.pid if standby.process else None}
        runs = {}
        for target, read_url in (("primary", None), ("standby", standby.url("kdbl_api"))):
            log(f"replica: searches reading on the {target}")
            runs[target] = _searches(owner_url, indexed["token"], queries, clients=clients, seconds=seconds,
                                     read_url=read_url, pids=pids)
    finally:
        standby.destroy()
    chunks = int(indexed["chunks"])
    return {"dataset": str(dataset), "documents": n_docs, "chunks": chunks, "crawl": indexed["crawl"],
            "wal_bytes": wal, "wal_bytes_per_chunk": round(wal / max(chunks, 1)), "lag_during_crawl": lag,
            "catch_up_s": round(catch_up_s, 3), "queries": len(queries), "reads": runs,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
            "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": round(os.getloadavg()[0], 2)}


def summarise(result: dict[str, Any]) -> str:
    lag = result["lag_during_crawl"]
    lines = [f"{result['documents']} documents, {result['chunks']:,} chunks crawled into the primary "
             f"({result['crawl']['files_per_s']} files/s); load average {result['load_average']}",
             f"WAL: {result['wal_bytes'] / 2**20:.1f} MB = {result['wal_bytes_per_chunk']:,} bytes a chunk",
             f"standby lag during the crawl ({lag.get('samples', 0)} samples): p50 {lag.get('bytes_p50', 0):,} / "
             f"p95 {lag.get('bytes_p95', 0):,} / max {lag.get('bytes_max', 0):,} bytes; "
             f"replay_lag p95 {lag.get('seconds_p95')} s, max {lag.get('seconds_max')} s; "
             f"caught up {result['catch_up_s']} s after the crawl",
             f"{'reads on':10}{'1 client p50 / p95 ms':>24}{'N clients req/s':>18}{'p50 ms':>9}  CPU ms a request"]
    for target, run in result["reads"].items():
        one, many = run["http_1_client"], run["http_n_clients"]
        cpu = ", ".join(f"{name} {ms}" for name, ms in many.get("cpu_ms_per_request", {}).items())
        lines.append(f"{target:10}{one['p50_ms']:>13} / {one['p95_ms']:<9}{many['requests_per_s']:>17}"
                     f"{many['p50_ms']:>9}  {cpu} (errors {one['errors'] + many['errors']})")
    return "\n".join(lines)
