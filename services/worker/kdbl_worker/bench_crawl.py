"""Crawl throughput: `python -m kdbl_worker.bench_crawl DIR [DIR ...] [--workers 1,2] [--json]`.

For each category of files found under the folders — text/Markdown (.txt .md .markdown .rst),
PDF, Office (.docx .pptx .xlsx .xlsm .odt) — and each worker count, it creates a fresh tenant with one
source per folder (the category's extensions as `include` globs), queues a run of each and starts that
many real `kdbl-worker` processes (kdbl_worker role, `--exit-when-idle`). Reported per run:

- files/s and MB/s over the runs' own span (first listing claim → last run finished, from the queue
  rows), for the files indexed (changed files; all of them on a fresh tenant). The workers are started
  and idle (connected, extraction children up) before the runs are queued: start-up is not counted;
- peak RSS of one worker's process tree (the worker and its extraction children) and summed over workers;
- CPU milliseconds per file of the workers' trees and, with the embedded database, of PostgreSQL
  (all its processes), over the same span.

`--copies N` indexes N copies of the folders (hard links in a temporary folder) for steadier numbers on
small corpora.

`--big-text-mb N` also indexes one generated plain-text file of N MB (prose-like sentences of made-up
words, paragraphs; seeded) as its own run, "big text": MB/s and chunks/s of one large file, written in
one transaction. Run it with a small-file folder so the same run gives the machine's reference rate
(the machine may be shared). A 5 MB text file used to hang the crawl (issue 12). `--report-pages N`
likewise indexes one generated N-page report PDF (kdbl_worker.bench_samples: prose, headings, tables),
"report PDF". Every run reports pages/s: the pages that gave text (each file's last page with a chunk).

Uses the embedded PostgreSQL in a temporary folder (or `--data-dir`), or `--database-url` (an owner
URL; the worker role must be able to log in without a password, as in the embedded default).
Linux only (/proc). Not a test: numbers depend on the machine; write them down with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kdbl_core.settings import child_env, load_settings
from kdbl_worker import bench_samples

CATEGORIES = {
    "text/Markdown": ["*.txt", "*.md", "*.markdown", "*.rst", "*.text"],
    "PDF": ["*.pdf"],
    "Office": ["*.docx", "*.pptx", "*.xlsx", "*.xlsm", "*.odt"],
}
BIG_TEXT = "big text"
REPORT = "report PDF"
_TICK = os.sysconf("SC_CLK_TCK")


def big_text(megabytes: float, seed: int = 7) -> str:
    """Prose-like plain text of `megabytes` MB: sentences of made-up words, paragraphs (deterministic)."""
    rnd = random.Random(seed)
    words = ["".join(rnd.choice("abcdefghijklmnoprstuvw") for _ in range(rnd.randint(3, 9))) for _ in range(30_000)]
    parts, size = [], 0
    while size < megabytes * 1_000_000:
        sentence = " ".join(rnd.choice(words) for _ in range(rnd.randint(8, 24))).capitalize() + ". "
        parts.append(sentence)
        size += len(sentence)
        if rnd.random() < 0.15:
            parts.append("\n\n")
    return "".join(parts)


def write_big_text(path: Path, megabytes: float, seed: int = 7) -> Path:
    """`big_text` written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(big_text(megabytes, seed))
    return path


def _proc_stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, cpu seconds incl. reaped children, rss bytes) of a live process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    cpu = sum(int(v) for v in fields[11:15]) / _TICK
    return int(fields[1]), cpu, int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def _tree(root: int) -> dict[int, tuple[float, int]]:
    """{pid: (cpu s, rss)} of `root` and its descendants."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            out[pid] = stats[pid][1:]
            todo.extend(p for p, s in stats.items() if s[0] == pid)
    return out


def _postgres_cpu(pgdata: Path | None) -> float | None:
    if pgdata is None:
        return None
    try:
        postmaster = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return sum(cpu for cpu, _ in _tree(postmaster).values())


def _connected(owner, names: list[str]) -> int:
    with owner.connection() as conn:
        return conn.execute("SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                            "WHERE application_name = ANY(%(n)s)", {"n": names}).fetchone()[0]


def _wait(predicate, timeout: float, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a worker exited early")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done after {timeout} s")
        time.sleep(0.1)


def _copy(folders: list[Path], target: Path, copies: int) -> Path:
    """`copies` copies of every file under `folders`, as hard links where possible."""
    for n in range(copies):
        for i, folder in enumerate(folders):
            for path in folder.rglob("*"):
                if path.is_file():
                    dest = target / f"copy{n}" / f"{i}-{folder.name}" / path.relative_to(folder)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(path, dest)
                    except OSError:
                        shutil.copy2(path, dest)
    return target


def _files(folders: list[Path], patterns: list[str]) -> list[Path]:
    suffixes = {p[1:] for p in patterns}
    return [p for folder in folders for p in folder.rglob("*")
            if p.is_file() and p.suffix.lower() in suffixes]


ACL_MODES = {"tenant": "tenant", "from-source": "source"}  # kdbl_core.access.share_acl.PERMISSION_MODES


def run_one(owner_url: str, folders: list[Path], category: str, workers: int, args: argparse.Namespace,
            pgdata: Path | None) -> dict:
    from psycopg.types.json import Jsonb

    from kdbl_core.db.connect import sync_pool
    from kdbl_core.db.urls import for_role
    from kdbl_worker.queue import enqueue

    owner = sync_pool(owner_url, size=2, name="kdbl-bench-crawl")
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    patterns = {BIG_TEXT: ["*.txt"], REPORT: ["*.pdf"]}.get(category) or CATEGORIES[category]
    # the tenant and its fs sources in SQL of its own: a worker tool imports no other service (the
    # import-linter contracts in pyproject.toml), and a bench folder needs none of kdbl-control's checks
    with owner.connection() as conn:
        tenant_id = conn.execute("INSERT INTO tenants (name) VALUES (%s) RETURNING id",
                                 (tenant,)).fetchone()[0]
        sources = [conn.execute("INSERT INTO sources (tenant_id, name, protocol, config, acl_mode) "
                                "VALUES (%s, %s, 'fs', %s, %s) RETURNING id",
                                (tenant_id, f"s{i}", Jsonb({"root": str(f.resolve()), "include": patterns}),
                                 ACL_MODES[args.permissions])).fetchone()[0]
                   for i, f in enumerate(folders)]
    url = for_role(owner_url, "kdbl_worker")
    names = [f"{tenant}-w{i}" for i in range(workers)]
    command = [sys.executable, "-m", "kdbl_worker.main", "--tenant", tenant, "--no-fetch", "--no-scheduler",
               "--idle-poll", "0.1"]
    if args.extract_processes is not None:
        command += ["--extract-processes", str(args.extract_processes)]
    def env(name: str) -> dict[str, str]:  # libpq takes the application_name from PGAPPNAME
        return child_env({"KDBL_LOG_LEVEL": "WARNING", "KDBL_DATABASE_URL": url, "PGAPPNAME": name})

    procs = [subprocess.Popen(command, env=env(name)) for name in names]
    try:
        # measure from the moment every worker is up and idle (connected, extraction children started)
        _wait(lambda: _connected(owner, names) == workers and all(len(_tree(p.pid)) > 1 for p in procs),
              120, procs)
        peak_tree = [0] * workers
        cpu0 = [sum(cpu for cpu, _ in _tree(p.pid).values()) for p in procs]
        cpu = list(cpu0)
        pg_before = _postgres_cpu(pgdata)
        job_ids = enqueue(owner, sources)

        def finished() -> bool:
            for i, proc in enumerate(procs):
                tree = _tree(proc.pid)
                peak_tree[i] = max(peak_tree[i], sum(rss for _, rss in tree.values()))
                cpu[i] = max(cpu[i], sum(c for c, _ in tree.values()))
            with owner.connection() as conn:
                return bool(conn.execute("SELECT bool_and(state IN ('done', 'failed')) FROM crawl_jobs "
                                         "WHERE id = ANY(%(ids)s)", {"ids": job_ids}).fetchone()[0])

        _wait(finished, args.timeout, procs)
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    last_cpu = [c - c0 for c, c0 in zip(cpu, cpu0, strict=True)]
    pg_after = _postgres_cpu(pgdata)
    with owner.connection() as conn:
        row = conn.execute(
            "SELECT min(started_at) AS t0, max(finished_at) AS t1, sum(indexed) AS files, "
            "sum(bytes) AS bytes, "
            "sum(failed) AS failed, sum(chunks) AS chunks, bool_and(state = 'done') AS ok "
            "FROM crawl_jobs WHERE id = ANY(%(ids)s)", {"ids": job_ids}).fetchone()
        runs = conn.execute(
            "SELECT count(*) FROM files f WHERE f.tenant_id = (SELECT id FROM tenants WHERE name = %(t)s) "
            "AND f.index_runs <> 1", {"t": tenant}).fetchone()[0]
        pages = conn.execute(
            "SELECT coalesce(sum(p), 0) FROM (SELECT max(c.page_no) AS p FROM chunks c "
            "WHERE c.tenant_id = (SELECT id FROM tenants WHERE name = %(t)s) GROUP BY c.file_id) x",
            {"t": tenant}).fetchone()[0]
    owner.close()
    seconds = (row.t1 - row.t0).total_seconds() if row.t0 and row.t1 else float("nan")
    files, size = int(row.files or 0), int(row.bytes or 0)
    return {
        "category": category, "workers": workers, "files": files, "failed": int(row.failed or 0),
        "chunks": int(row.chunks or 0), "mb": round(size / 1e6, 2), "seconds": round(seconds, 2),
        "files_per_s": round(files / seconds, 1) if files else None,
        "mb_per_s": round(size / 1e6 / seconds, 2) if files else None,
        "chunks_per_s": round(int(row.chunks or 0) / seconds) if files else None,
        "pages": int(pages), "pages_per_s": round(int(pages) / seconds, 1) if pages else None,
        "peak_rss_mb_per_worker": round(max(peak_tree) / 2**20, 1),
        "peak_rss_mb_all_workers": round(sum(peak_tree) / 2**20, 1),
        "worker_cpu_ms_per_file": round(sum(last_cpu) / files * 1000, 2) if files else None,
        "postgres_cpu_ms_per_file": round((pg_after - pg_before) / files * 1000, 2)
        if files and pg_before is not None and pg_after is not None else None,
        "all_done": bool(row.ok), "files_not_indexed_exactly_once": int(runs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--workers", default="1,2", help="worker process counts to run (default 1,2)")
    parser.add_argument("--categories", default=",".join(CATEGORIES),
                        help="subset of: " + ", ".join(CATEGORIES))
    parser.add_argument("--extract-processes", type=int, default=None)
    parser.add_argument("--data-dir", type=Path,
                        help="embedded PostgreSQL data folder (default: a temporary one)")
    parser.add_argument("--database-url",
                        help="owner URL of an existing database instead of the embedded one")
    parser.add_argument("--copies", type=int, default=1, help="index N copies of the folders (default 1)")
    parser.add_argument("--big-text-mb", type=float, default=0,
                        help="also index one generated plain-text file of this many MB (own run)")
    parser.add_argument("--report-pages", type=int, default=0,
                        help="also index one generated report PDF of this many pages (own run)")
    parser.add_argument("--permissions", choices=list(ACL_MODES), default="tenant",
                        help="the sources' permissions: from-source also reads each file's and folder's POSIX "
                        "permissions and ACL (issue 30's cost)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    folders = [f.resolve() for f in args.folders]
    copies_dir = None
    if args.copies > 1:
        copies_dir = Path(tempfile.mkdtemp(prefix="kdbl-bench-copies-"))
        folders = [_copy(folders, copies_dir, args.copies)]
    counts = [int(n) for n in args.workers.split(",")]
    categories = [c for c in args.categories.split(",") if _files(folders, CATEGORIES[c])]
    runs = [(c, folders) for c in categories]
    big_dir = None
    if args.big_text_mb > 0:
        big_dir = Path(tempfile.mkdtemp(prefix="kdbl-bench-big-"))
        write_big_text(big_dir / "big.txt", args.big_text_mb)
        runs.append((BIG_TEXT, [big_dir]))
    report_dir = None
    if args.report_pages > 0:
        report_dir = Path(tempfile.mkdtemp(prefix="kdbl-bench-report-"))
        bench_samples.write_report_pdf(report_dir / "report.pdf", args.report_pages)
        runs.append((REPORT, [report_dir]))
    results = []

    def bench(owner_url: str, pgdata: Path | None) -> None:
        for category, run_folders in runs:
            for n in counts if category not in (BIG_TEXT, REPORT) else counts[:1]:
                result = run_one(owner_url, run_folders, category, n, args, pgdata)
                results.append(result)
                if not args.json:
                    print(_line(result), flush=True)

    load = os.getloadavg()[0]
    if not args.json:
        print(f"{os.cpu_count()} cores, load average {load:.2f}; permissions: {args.permissions}; "
              f"folders: {', '.join(map(str, folders))}")
        print(f"{'category':<14}{'workers':>8}{'files':>7}{'files/s':>9}{'MB/s':>8}{'chunks/s':>9}{'pages/s':>9}"
              f"{'RSS/worker':>11}"
              f"{'RSS all':>9}{'cpu ms/f':>10}{'pg ms/f':>9}")
    if args.database_url:
        bench(args.database_url, None)
    else:
        from kdbl_core.db.embedded_postgres import EmbeddedDatabase

        work = args.data_dir or Path(tempfile.mkdtemp(prefix="kdbl-bench-crawl-"))
        try:
            with EmbeddedDatabase(work, settings=load_settings()) as db:
                bench(db.owner_url, work / "pgdata")
        finally:
            if args.data_dir is None:
                shutil.rmtree(work, ignore_errors=True)
            if copies_dir is not None:
                shutil.rmtree(copies_dir, ignore_errors=True)
            for folder in (big_dir, report_dir):
                if folder is not None:
                    shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps({"cores": os.cpu_count(), "load_average": load, "permissions": args.permissions,
                          "results": results}, indent=2))
    return 0


def _line(r: dict) -> str:
    def f(value: object, width: int) -> str:
        return f"{'-' if value is None else value:>{width}}"

    return (f"{r['category']:<14}{r['workers']:>8}{r['files']:>7}"
            f"{f(r['files_per_s'], 9)}{f(r['mb_per_s'], 8)}{f(r['chunks_per_s'], 9)}{f(r['pages_per_s'], 9)}"
            f"{r['peak_rss_mb_per_worker']:>10}M{r['peak_rss_mb_all_workers']:>8}M"
            f"{f(r['worker_cpu_ms_per_file'], 10)}{f(r['postgres_cpu_ms_per_file'], 9)}")


if __name__ == "__main__":
    sys.exit(main())
