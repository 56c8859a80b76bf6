"""`kdbl-control bench entities`: how well and how fast the entity extractor reads text (issue 31).

Quality: precision, recall and F1 of `kdbl_core.content.entities.extract` against hand-labelled sentences
(tests/data/entities/labeled.jsonl: JSON lines of {id, source, text, entities: [[start, end, TYPE], ...]}),
overall and per type, two ways: *strict* (same span, same type) and *span* (same span, any type: found
but typed wrongly still counts). Speed: chunks of ~1,000 characters a second and microseconds a chunk,
extracting over a folder of text (Markdown, text, HTML tags stripped), single-threaded, on this machine.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kdbl_core.content import entities

CHUNK_CHARS = 1000


def load_labeled(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        for start, end, kind in row["entities"]:
            if not (0 <= start < end <= len(row["text"])) or kind not in entities.TYPES:
                raise ValueError(f"{path}: {row['id']}: bad label {start, end, kind}")
    return rows


def _prf(tp: int, fp: int, fn: int) -> dict[str, float | int]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return {"precision": round(p, 3), "recall": round(r, 3), "f1": round(2 * p * r / (p + r), 3) if p + r else 0.0,
            "gold": tp + fn, "found": tp + fp}


def quality(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Strict and span-only scores, overall and per type; the misses and false finds, a few of each."""
    tp: Counter[str] = Counter()
    fp: Counter[str] = Counter()
    fn: Counter[str] = Counter()
    span_tp = span_fp = span_fn = 0
    misses, false = [], []
    for row in rows:
        gold = {(s, e, t) for s, e, t in row["entities"]}
        found = {(m.start, m.end, m.type) for m in entities.extract(row["text"])}
        for item in found & gold:
            tp[item[2]] += 1
        for item in found - gold:
            fp[item[2]] += 1
            false.append((row["id"], row["text"][item[0]:item[1]], item[2]))
        for item in gold - found:
            fn[item[2]] += 1
            misses.append((row["id"], row["text"][item[0]:item[1]], item[2]))
        gold_spans, found_spans = {(s, e) for s, e, _ in gold}, {(s, e) for s, e, _ in found}
        span_tp += len(gold_spans & found_spans)
        span_fp += len(found_spans - gold_spans)
        span_fn += len(gold_spans - found_spans)
    per_type = {t: _prf(tp[t], fp[t], fn[t]) for t in entities.TYPES}
    return {"sentences": len(rows), "strict": _prf(sum(tp.values()), sum(fp.values()), sum(fn.values())),
            "span": _prf(span_tp, span_fp, span_fn), "per_type": per_type,
            "missed_examples": misses[:15], "false_examples": false[:15]}


def _texts(folder: Path, limit_chars: int) -> list[str]:
    chunks: list[str] = []
    total = 0
    for path in sorted(folder.rglob("*")):
        if path.suffix.lower() not in (".md", ".txt", ".html", ".htm") or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix.lower() in (".html", ".htm"):
            text = re.sub(r"<[^>]+>", " ", text)
        for at in range(0, len(text), CHUNK_CHARS):
            chunks.append(text[at:at + CHUNK_CHARS])
            total += CHUNK_CHARS
            if total >= limit_chars:
                return chunks
    return chunks


def speed(folder: Path | None, rows: list[dict[str, Any]], *, limit_chars: int = 2_000_000,
          runs: int = 3) -> dict[str, Any]:
    """Extraction over ~`limit_chars` of the folder's text in chunks of CHUNK_CHARS (or the labelled
    sentences when there is no folder): the median of `runs`."""
    chunks = _texts(folder, limit_chars) if folder is not None and folder.is_dir() else [r["text"] for r in rows]
    entities.extract("warm the gazetteers up")
    seconds = []
    mentions = 0
    for _ in range(runs):
        started = time.perf_counter()
        mentions = sum(len(entities.extract(c)) for c in chunks)
        seconds.append(time.perf_counter() - started)
    took = statistics.median(seconds)
    chars = sum(len(c) for c in chunks)
    return {"chunks": len(chunks), "characters": chars, "seconds": round(took, 3),
            "chunks_per_s": round(len(chunks) / took, 1), "us_per_chunk": round(1e6 * took / max(len(chunks), 1), 1),
            "mb_per_s": round(chars / took / 1e6, 2), "mentions_per_chunk": round(mentions / max(len(chunks), 1), 2),
            "text": str(folder) if folder is not None and folder.is_dir() else "the labelled sentences"}


def run_entities_bench(labeled: Path, text_dir: Path | None) -> dict[str, Any]:
    rows = load_labeled(labeled)
    return {"labeled": str(labeled), "quality": quality(rows), "speed": speed(text_dir, rows),
            "date": time.strftime("%Y-%m-%d %H:%M"), "load_average": round(os.getloadavg()[0], 2)}


def summarise(result: dict[str, Any]) -> str:
    q, s = result["quality"], result["speed"]
    lines = [f"entities: {q['sentences']} labelled sentences ({result['labeled']}); load average {result['load_average']}",
             f"{'':<10}{'precision':>10}{'recall':>8}{'F1':>7}{'gold':>6}{'found':>7}"]
    for name, row in (("strict", q["strict"]), ("span only", q["span"]), *q["per_type"].items()):
        lines.append(f"{name:<10}{row['precision']:>10}{row['recall']:>8}{row['f1']:>7}{row['gold']:>6}{row['found']:>7}")
    lines.append(f"speed: {s['chunks']} chunks of ~{CHUNK_CHARS} characters from {s['text']}: {s['chunks_per_s']} chunks/s, "
                 f"{s['us_per_chunk']} µs a chunk, {s['mb_per_s']} MB/s, {s['mentions_per_chunk']} mentions a chunk")
    return "\n".join(lines)
