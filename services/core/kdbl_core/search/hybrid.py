"""Fusion of the keyword and semantic arms (and, in search mode graph, the entity arm): weighted
reciprocal-rank fusion, identifier safety, diversification, and per-hit explanations.

RRF (score = Σ w_arm / (k + rank_arm)) needs no score calibration between BM25 and cosine, which have
unrelated scales. Two safeguards on top:
  * exact identifiers — a query term that looks like an identifier (contains a digit, or '_'/'-' inside)
    and is rare in what the caller sees (df ≤ 3) pins the keyword hits that contain it to the top, so a vector
    arm full of near-paraphrases can never bury the one chunk holding "ERR-4021";
  * diversification — at most `max_per_file` hits per file, and a chunk adjacent (±1 seq) to an
    already chosen one is skipped, since each hit's text already carries its neighbours; a chunk whose
    text a chosen hit already has is folded into that hit's `copies` (kdbl_core.search.duplicates).

While the searched sources are partly embedded (the worker fills vectors after the crawl; a source may
have hybrid off), the candidates without a vector cannot be scored by the vector arm: min-max normalised
they would count as its worst, and the few chunks already embedded would push the exact keyword matches
down (measured on the long-document eval half embedded: docs/benchmarks.md). `keep_keyword_slots` fuses
only what both arms score: the candidates in keyword order, the places held by embedded ones refilled
with the embedded ones in fused order, the others left where the keyword arm put them. Fully embedded it
is the fused order; with nothing embedded, the keyword order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from kdbl_core.search import duplicates
from kdbl_core.search.lexical import RANK_SCALE, ChunkHit

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
    copies: list[ChunkHit] = field(default_factory=list)  # chunks with the same text, folded into this one
    graph_rank: int | None = None  # search mode graph: the entity arm's (kdbl_core.search.entity_arm)
    graph_score: float | None = None

    def explanation(self) -> dict:
        return {"lexical_rank": self.lexical_rank, "lexical_score": self.lexical_score,
                "vector_rank": self.vector_rank, "vector_score": self.vector_score,
                "graph_rank": self.graph_rank, "graph_score": self.graph_score,
                "fused": round(self.score, 6), "pinned_identifier": self.pinned}


def is_identifier(term: str) -> bool:
    return len(term) >= 3 and bool(_IDENTIFIER.search(term))


def fuse(lexical: list[ChunkHit], vector: list[ChunkHit], *, k: int = 60, vector_weight: float = 1.0,
         pinned_chunks: set[int] | None = None, graph: Sequence[ChunkHit] = (), graph_weight: float = 1.0
         ) -> list[Fused]:
    """RRF of the keyword, vector and (search mode graph) entity arms: Σ weight / (k + rank)."""
    by_chunk: dict[int, Fused] = {}
    for rank, hit in enumerate(lexical, 1):
        entry = by_chunk.setdefault(hit.chunk_id, Fused(hit=hit, score=0.0))
        entry.score += 1.0 / (k + rank)
        entry.lexical_rank, entry.lexical_score = rank, round(hit.score, 6)
    for rank, hit in enumerate(vector, 1):
        entry = by_chunk.setdefault(hit.chunk_id, Fused(hit=hit, score=0.0))
        entry.score += vector_weight / (k + rank)
        entry.vector_rank, entry.vector_score = rank, round(hit.score, 6)
    for rank, hit in enumerate(graph, 1):
        entry = by_chunk.setdefault(hit.chunk_id, Fused(hit=hit, score=0.0))
        entry.score += graph_weight / (k + rank)
        entry.graph_rank, entry.graph_score = rank, round(hit.score, 6)
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


def keep_keyword_slots(ranked: list[Fused], lexical_scores: Mapping[int, float],
                       embedded: Collection[int]) -> list[Fused]:
    """`ranked` (fused, pinned first) with the candidates lacking a vector kept at their keyword rank: the
    candidates in keyword order (pinned first, then BM25, then chunk id), each place held by an embedded
    one refilled with the next embedded one in `ranked`'s order."""
    def keyword_key(f: Fused) -> tuple[bool, int, int]:
        return (not f.pinned, -round(lexical_scores.get(f.hit.chunk_id, 0.0) * RANK_SCALE), f.hit.chunk_id)

    fused_order = iter([f for f in ranked if f.hit.chunk_id in embedded])
    return [next(fused_order) if f.hit.chunk_id in embedded else f for f in sorted(ranked, key=keyword_key)]


def diverse(max_per_file: int) -> Callable[[ChunkHit], bool]:
    """The diversification test, with its own state: takes a hit unless its file has `max_per_file`
    already or it is adjacent (±1 seq) to one taken."""
    per_file: dict[int, list[int]] = {}

    def admit(hit: ChunkHit) -> bool:
        seqs = per_file.setdefault(hit.file_id, [])
        if len(seqs) >= max_per_file or any(abs(hit.seq - s) <= 1 for s in seqs):
            return False
        seqs.append(hit.seq)
        return True

    return admit


def diversify(ranked: list[Fused], *, limit: int, max_per_file: int,
              keys: Mapping[int, duplicates.TextKey] | None = None) -> list[Fused]:
    """The first `limit` diverse candidates; with `keys` (duplicates.text_keys), one per text, the
    copies found in `ranked` on each chosen candidate (`copies`)."""
    groups, _ = duplicates.collapse(ranked, keys or {}, chunk=lambda f: f.hit, limit=limit,
                                    admit=diverse(max_per_file))
    for group in groups:
        group.item.copies = group.copies
    return [group.item for group in groups]
