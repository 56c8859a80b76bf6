"""Extraction throughput per format: `python -m kdbl_worker.extract.bench DIR [--repeat N]`.

Every format runs in its own child process, so the peak RSS reported is that format's
alone (interpreter and library imports included). Library imports happen before the
clock starts; the time is the sum of `extract()` calls over all files, `--repeat` times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from kdbl_worker.extract import Source, detect, extract


def _files_by_format(root: Path) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(root.rglob("*")):
        if path.is_file() and detect(path.name)[1] is not None:
            groups[path.suffix.lower()].append(path)
    return dict(groups)


def measure(files: list[Path], repeat: int) -> dict:
    """Time extract() over `files` in this process; returns one result row."""
    importlib.import_module(detect(files[0].name)[1].split(":")[0])  # import outside the clock
    statuses: Counter[str] = Counter()
    elapsed = 0.0
    for round_no in range(repeat):
        for path in files:
            with path.open("rb") as stream:
                start = time.perf_counter()
                result = extract(Source(stream, path.name, path.stat().st_size))
                elapsed += time.perf_counter() - start
            if round_no == 0:
                statuses[result.status] += 1
    size = sum(p.stat().st_size for p in files) * repeat
    return {
        "files": len(files),
        "mb": size / 1e6 / repeat,
        "seconds": elapsed,
        "files_per_s": len(files) * repeat / elapsed if elapsed else float("inf"),
        "mb_per_s": size / 1e6 / elapsed if elapsed else float("inf"),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # Linux: KiB
        "statuses": dict(statuses),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--repeat", type=int, default=3, help="passes over the files (default 3)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # child mode: one extension, JSON out
    args = parser.parse_args(argv)
    groups = _files_by_format(args.directory)
    if args.only:
        print(json.dumps(measure(groups[args.only], args.repeat)))
        return 0
    if not groups:
        print(f"no supported files under {args.directory}", file=sys.stderr)
        return 1
    header = f"{'format':8} {'files':>5} {'MB':>7} {'files/s':>9} {'MB/s':>7} {'peak RSS MB':>11}  statuses"
    print(header)
    print("-" * len(header))
    for suffix in sorted(groups):
        child = subprocess.run(
            [
                sys.executable,
                "-m",
                "kdbl_worker.extract.bench",
                str(args.directory),
                "--repeat",
                str(args.repeat),
                "--only",
                suffix,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode != 0:
            print(f"{suffix:8} failed: {child.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(child.stdout)
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(row["statuses"].items()))
        print(
            f"{suffix:8} {row['files']:>5} {row['mb']:>7.2f} {row['files_per_s']:>9.1f} "
            f"{row['mb_per_s']:>7.2f} {row['peak_rss_mb']:>11.0f}  {statuses}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
