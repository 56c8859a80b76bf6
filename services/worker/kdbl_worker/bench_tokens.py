"""Measure per-chunk token counting (kdbl_worker.token_counts) on a corpus: the estimate's error against
the model's tokenizer, and what each costs per MB beside extraction and chunking (in-process, one core).

    python -m kdbl_worker.bench_tokens ../shared/data/scifact --model ~/.cache/kdbl/models/all-minilm-l6-v2.f16.gguf
    python -m kdbl_worker.bench_tokens ../shared/data/docs-corpus --glob '**/*.md' --model ...

A folder with corpus.jsonl (BEIR: title + text per line) is read as one text file per document; any
other folder as its files matching --glob. Results: docs/benchmarks.md "Per-chunk token counts".
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path

from kdbl_core.embedder import Tokenizer
from kdbl_worker.sandbox import Limits, extract_and_chunk
from kdbl_worker.token_counts import estimate


def _documents(root: Path, pattern: str) -> list[tuple[str, bytes]]:
    corpus = root / "corpus.jsonl"
    if corpus.is_file():
        with corpus.open() as lines:
            return [(f"{d['_id']}.txt", f"{d.get('title', '')}\n\n{d['text']}".encode())
                    for d in map(json.loads, lines)]
    return [(p.name, p.read_bytes()) for p in sorted(root.glob(pattern)) if p.is_file()]


def measure(root: Path, model: Path, pattern: str = "**/*.md") -> dict:
    documents = _documents(root, pattern)
    mb = sum(len(data) for _, data in documents) / 1e6
    started = time.perf_counter()
    outcomes = [extract_and_chunk(name, len(data), io.BytesIO(data), Limits()) for name, data in documents]
    extract_s = time.perf_counter() - started
    chunks = [c[1] for o in outcomes for c in o.chunks]
    tokenizer = Tokenizer(model)
    try:
        started = time.perf_counter()
        real = [tokenizer.count(c) for c in chunks]
        tokenizer_s = time.perf_counter() - started
    finally:
        tokenizer.close()
    started = time.perf_counter()
    guessed = [estimate(c) for c in chunks]
    estimate_s = time.perf_counter() - started
    errors = sorted(abs(g - r) / r for g, r in zip(guessed, real, strict=True) if r)
    return {
        "files": len(documents), "mb": round(mb, 2), "chunks": len(chunks),
        "extract_chunk_s_per_mb": round(extract_s / mb, 3), "tokenizer_s_per_mb": round(tokenizer_s / mb, 3),
        "estimate_s_per_mb": round(estimate_s / mb, 3),
        "estimate_mean_abs_error": round(statistics.mean(errors), 3),
        "estimate_p50_abs_error": round(errors[len(errors) // 2], 3),
        "estimate_p95_abs_error": round(errors[int(0.95 * len(errors))], 3),
        "estimate_total_error": round(sum(guessed) / sum(real) - 1, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path)
    parser.add_argument("--model", type=Path, required=True, help="the GGUF embedding model")
    parser.add_argument("--glob", default="**/*.md", help="files of a folder without corpus.jsonl")
    args = parser.parse_args()
    print(json.dumps(measure(args.corpus, args.model.expanduser(), args.glob)))


if __name__ == "__main__":
    main()
