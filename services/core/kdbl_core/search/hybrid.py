"""Fusion of the keyword and semantic arms: weighted reciprocal-rank fusion, identifier safety,
diversification, and per-hit explanations.

RRF (score = Σ w_arm / (k + rank_arm)) needs no score calibration between BM25 and cosine, which have
unrelated scales. Two safeguards on top:
  * exact identifiers — a query term that looks like an identifier (contains a digit, or '_'/'-' inside)
    and is rare in what the caller sees (df ≤ 3) pins the keyword hits that contain it to the top, so a vector
    arm full of near-paraphrases can never bury the one chunk holding "ERR-4021";
  * diversification — at most `max_per_file` hits per file, and a chunk adjacent (±1 seq) to an
    already chosen one is skipped, since each hit's text already carries its neighbours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdbl_core.search.lexical import ChunkHit

_IDENTIFIER = re.compile(r"\d|[a-z0-9][_-][a-z0-9]")


@dataclass(slots=True)
class Fused:
    hit: ChunkHit
    score: float
    lexical_rank: int | None = None
    lexical_score: float | None = None
    vector_rank: int | None = None
    vector_score: float | None = None
    pinned: bool = False

    def explanation(self) -> dict:
        return {"lexical_rank": self.lexical_rank, "lexical_score": self.lexical_score,
                "vector_rank": self.vector_rank, "vector_score": self.vector_score,
                "fused": round(self.score, 6), "pinned_identifier": self.pinned}


def is_identifier(term: str) -> bool:
    return len(term) >= 3 and bool(_IDENTIFIER.search(term))


def fuse(lexical: list[ChunkHit], vector: list[ChunkHit], *, k: int = 60, vector_weight: float = 1.0,
         pinned_chunks: set[int] | None = None) -> list[Fused]:
    by_chunk: dict[int, Fused] = {}
    for rank, hit in enumerate(lexical, 1):
        entry = by_chunk.setdefault(hit.chunk_id, Fused(hit=hit, score=0.0))
        entry.score += 1.0 / (k + rank)
        entry.lexical_rank, entry.lexical_score = rank, round(hit.score, 6)
    for rank, hit in enumerate(vector, 1):
        entry = by_chunk.setdefault(hit.chunk_id, Fused(hit=hit, score=0.0))
        entry.score += vector_weight / (k + rank)
        entry.vector_rank, entry.vector_score = rank, round(hit.score, 6)
    for chunk_id in pinned_chunks or ():
        if chunk_id in by_chunk:
            by_chunk[chunk_id].pinned = True
    return sorted(by_chunk.values(), key=lambda f: (not f.pinned, -f.score, f.hit.chunk_id))


def _min_max(values: dict[int, float], ids: list[int]) -> dict[int, float]:
    present = [values[i] for i in ids if i in values]
    if not present:
        return {i: 0.0 for i in ids}
    low, high = min(present), max(present)
    if high == low:  # one scored candidate, or all tied: each is the arm's best, unscored ones its worst
        return {i: 1.0 if i in values else 0.0 for i in ids}
    return {i: (values[i] - low) / (high - low) if i in values else 0.0 for i in ids}


def rescore(fused: list[Fused], lexical_scores: dict[int, float], vector_scores: dict[int, float], *,
            lexical_weight: float) -> list[Fused]:
    """Rerank the fused candidates by a convex combination of both arms' *complete* scores.

    RRF sees only ranks, and only where a chunk made an arm's top `depth`; here every candidate has its
    exact BM25 score and exact cosine similarity (looked up for the arm that did not return it), each
    min-max normalised over the candidates, combined as w·bm25 + (1 − w)·cosine. Pinned identifiers stay
    first. Measured against RRF on SciFact in docs/benchmarks.md.
    """
    ids = [f.hit.chunk_id for f in fused]
    lex, vec = _min_max(lexical_scores, ids), _min_max(vector_scores, ids)
    for f in fused:
        cid = f.hit.chunk_id
        f.lexical_score = round(lexical_scores[cid], 6) if cid in lexical_scores else None
        f.vector_score = round(vector_scores[cid], 6) if cid in vector_scores else None
        f.score = lexical_weight * lex[cid] + (1 - lexical_weight) * vec[cid]
    return sorted(fused, key=lambda f: (not f.pinned, -f.score, f.hit.chunk_id))


def diversify(ranked: list[Fused], *, limit: int, max_per_file: int) -> list[Fused]:
    chosen: list[Fused] = []
    per_file: dict[int, list[int]] = {}
    for item in ranked:
        seqs = per_file.setdefault(item.hit.file_id, [])
        if len(seqs) >= max_per_file or any(abs(item.hit.seq - s) <= 1 for s in seqs):
            continue
        seqs.append(item.hit.seq)
        chosen.append(item)
        if len(chosen) == limit:
            break
    return chosen
