"""Grounded answers from what the caller's search returned: the `answer` tool's core.

Both kinds start from one search through the pipeline (kdbl_core.search.pipeline, in the caller's RLS
transaction: only what the principal may see is ever read) and the matched chunks of its top ANSWER_HITS
hits, each an exact slice `text[char_start:char_end]` of its file's extracted text (the chunker's
invariant), so a sentence's offsets in its chunk plus the chunk's char_start are its offsets in the file:
get_file_text's text[start:end] is the cited sentence, character for character.

Sentences are scored against the question (`score_sentences`): BM25 over the candidate sentences, the
question's Postgres lexemes matched by the same Snowball stemming the snippets use (snippets.
lexeme_matches; stop words never count), each lexeme weighted by its rarity among the candidates (idf),
term frequency saturated (k1 1.2) and length-normalised (b 0.75); times (1 + coverage), the share of the
question's idf weight the sentence matches; times a position prior, 5% less per hit rank and 2% less per
sentence into the chunk (both capped at 10). A sentence is relevant when its coverage is at least
MIN_COVERAGE (a quarter of the question's weight): a chance hit on one common word does not make an
answer, and when no sentence is relevant the answer is NOT_FOUND with no citation.

extractive: the best relevant sentences, best first, each with its citation, until max_tokens (tokens
estimated as characters / 4, as no model need be loaded; one over-long sentence is cut, its range with
it). abstractive: the chunks holding relevant sentences become numbered passages, the only context the
chat model gets (`messages`); its [n] markers become citations (`cited`). Measured in docs/benchmarks.md:
an extractive answer's p50 latency over 30 SciFact-like questions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from kdbl_core.content.records import Chunk
from kdbl_core.db.async_pool import Connection
from kdbl_core.search.snippets import lexeme_matches

ANSWER_HITS = 8  # hits whose chunks are read: the top of the ranking holds the answer when there is one
NOT_FOUND = "Not found in the sources."
MIN_COVERAGE = 0.25
MAX_SENTENCES = 8
CHARS_PER_TOKEN = 4
K1, B = 1.2, 0.75

# The hits' matched chunks (not the neighbour windows: those are cut with ellipses), and the question's
# lexemes, under the caller's RLS.
_CHUNKS = """
SELECT h.ord, c.text, c.char_start, c.char_end, c.page_no, c.ts_start_ms, c.ts_end_ms,
       (SELECT array_agg(DISTINCT t.term) FROM kdbl_terms(CAST(%(cfg)s AS regconfig), %(query)s) AS t) AS lexemes
  FROM unnest(CAST(%(sids)s AS uuid[]), CAST(%(keys)s AS text[]), CAST(%(seqs)s AS int[]))
       WITH ORDINALITY AS h(source_id, key, seq, ord)
  JOIN files f ON f.source_id = h.source_id AND f.key = h.key
  JOIN chunks c ON c.file_id = f.id AND c.seq = h.seq
 ORDER BY h.ord
"""
# a sentence ends at . ! ? or 。 followed by white space, or at a line end
_SENTENCE_END = re.compile(r"[.!?。]+(?=\s)|\n")
_WORD = re.compile(r"\w+")
_MARKER = re.compile(r"\[(\d{1,3})\]")

SYSTEM_PROMPT = (
    "You answer questions using only the numbered passages the user gives you. Cite every claim with the "
    "number of the passage that supports it in square brackets, like [1] or [2][3]. Use no other knowledge. "
    f"If the passages do not answer the question, reply exactly: {NOT_FOUND}")


@dataclass(frozen=True, slots=True)
class Passage:
    """A hit's matched chunk (the one chunk record, kdbl_core.content.records.Chunk) and where it is."""

    rank: int  # 0-based position in the search's ranking
    source_id: str
    key: str
    chunk: Chunk

    @property
    def seq(self) -> int:
        return self.chunk.seq

    @property
    def text(self) -> str:
        return self.chunk.text

    @property
    def char_start(self) -> int:
        return self.chunk.char_start

    @property
    def char_end(self) -> int:
        return self.chunk.char_end

    @property
    def page_no(self) -> int | None:
        return self.chunk.page_no

    @property
    def ts_start_ms(self) -> int | None:
        return self.chunk.ts_start_ms

    @property
    def ts_end_ms(self) -> int | None:
        return self.chunk.ts_end_ms


@dataclass(frozen=True, slots=True)
class Sentence:
    passage: Passage
    start: int  # offsets in the file's extracted text
    end: int
    text: str
    score: float
    coverage: float


async def passages(conn: Connection, hits: Sequence[dict[str, Any]], *, question: str,
                   ts_config: str) -> tuple[list[Passage], frozenset[str]]:
    """The hits' matched chunks in ranking order, and the question's lexemes (one round trip)."""
    if not hits:
        return [], frozenset()
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(_CHUNKS, {"sids": [h["source_id"] for h in hits], "keys": [h["key"] for h in hits],
                                    "seqs": [h["seq"] for h in hits], "cfg": ts_config, "query": question})
        rows = await cur.fetchall()
    lexemes = frozenset(rows[0]["lexemes"] or ()) if rows else frozenset()
    out = []
    for row in rows:
        hit = hits[row["ord"] - 1]
        out.append(Passage(row["ord"] - 1, hit["source_id"], hit["key"], Chunk(
            hit["seq"], row["text"], row["char_start"], row["char_end"], row["page_no"], row["ts_start_ms"],
            row["ts_end_ms"])))
    return out, lexemes


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each sentence of `text`, white space trimmed; blank pieces left out."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        spans.append((start, m.end()))
        start = m.end()
    spans.append((start, len(text)))
    out = []
    for s, e in spans:
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        if e > s and any(c.isalnum() for c in text[s:e]):
            out.append((s, e))
    return out


def score_sentences(found: Sequence[Passage], lexemes: frozenset[str], ts_config: str) -> list[Sentence]:
    """Every sentence of the passages that matches a question lexeme, scored (module docstring), best
    first; a sentence seen already (the same text in another hit) is left out."""
    if not lexemes:
        return []
    candidates: list[tuple[Passage, int, int, int, dict[str, int], int]] = []
    for passage in found:
        for position, (s, e) in enumerate(sentence_spans(passage.text)):
            counts: dict[str, int] = {}
            for _, _, lexeme in lexeme_matches(passage.text[s:e], lexemes, ts_config):
                counts[lexeme] = counts.get(lexeme, 0) + 1
            length = max(1, len(_WORD.findall(passage.text, s, e)))
            candidates.append((passage, s, e, position, counts, length))
    n = len(candidates)
    if not n:
        return []
    df = {lexeme: sum(1 for c in candidates if lexeme in c[4]) for lexeme in lexemes}
    idf = {lexeme: math.log(1 + (n - df[lexeme] + 0.5) / (df[lexeme] + 0.5)) for lexeme in lexemes}
    total_weight = math.fsum(idf.values()) or 1.0  # fsum: the same sum whatever the set's order (hash seed)
    avg_length = sum(c[5] for c in candidates) / n
    scored, seen = [], set()
    for passage, s, e, position, counts, length in candidates:
        if not counts:
            continue
        norm = K1 * (1 - B + B * length / avg_length)
        bm25 = sum(idf[lex] * tf * (K1 + 1) / (tf + norm) for lex, tf in counts.items())
        coverage = math.fsum(idf[lex] for lex in counts) / total_weight
        prior = (1 - 0.05 * min(passage.rank, 10)) * (1 - 0.02 * min(position, 10))
        text = passage.text[s:e]
        if text in seen:
            continue
        seen.add(text)
        scored.append(Sentence(passage, passage.char_start + s, passage.char_start + e, text,
                               bm25 * (1 + coverage) * prior, coverage))
    scored.sort(key=lambda x: -x.score)
    return scored


def relevant(sentences: Sequence[Sentence]) -> list[Sentence]:
    return [s for s in sentences if s.coverage >= MIN_COVERAGE]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def extractive(sentences: Sequence[Sentence], *, max_tokens: int) -> tuple[list[Sentence], bool]:
    """The relevant sentences that fit max_tokens (estimated), best first; whether one was cut to fit.
    Each cited sentence costs its text and its " [n]" marker."""
    chosen: list[Sentence] = []
    used = 0
    for sentence in relevant(sentences)[:MAX_SENTENCES]:
        cost = estimate_tokens(sentence.text) + 2
        if used + cost <= max_tokens:
            chosen.append(sentence)
            used += cost
            continue
        if not chosen:  # the best sentence alone is too long: its head, with its range cut to match
            keep = max(1, (max_tokens - 2) * CHARS_PER_TOKEN)
            chosen.append(Sentence(sentence.passage, sentence.start, sentence.start + keep, sentence.text[:keep],
                                   sentence.score, sentence.coverage))
            return chosen, True
        break
    return chosen, False


def passages_with_answers(sentences: Sequence[Sentence]) -> list[Passage]:
    """The passages holding a relevant sentence, in ranking order (an abstractive answer's context)."""
    by_rank = {s.passage.rank: s.passage for s in relevant(sentences)}
    return [by_rank[r] for r in sorted(by_rank)]


def messages(question: str, found: Sequence[Passage], *, budget_tokens: int,
             count_tokens: Callable[[str], int]) -> tuple[list[dict[str, str]], list[Passage]]:
    """The chat messages: the instructions, then the numbered passages and the question, within
    `budget_tokens` (the model's context less the answer's max_tokens): passages that do not fit are
    left out from the last, and a lone first passage is cut. Returns the passages the prompt numbers."""
    def user(items: Sequence[tuple[Passage, str]]) -> str:
        numbered = "\n\n".join(f"[{i}] ({p.key})\n{text}" for i, (p, text) in enumerate(items, 1))
        return f"Passages:\n\n{numbered}\n\nQuestion: {question}"

    items = [(p, p.text) for p in found]
    fixed = count_tokens(SYSTEM_PROMPT) + 32  # the chat template's own tokens
    while items and fixed + count_tokens(user(items)) > budget_tokens:
        if len(items) > 1:
            items.pop()
            continue
        passage, text = items[0]
        over = fixed + count_tokens(user(items)) - budget_tokens
        keep = len(text) - max(over * CHARS_PER_TOKEN, len(text) // 4)
        if keep < 200:
            items = []
            break
        items = [(passage, text[:keep])]
    kept = [p for p, _ in items]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user(items)}], kept


def cited(text: str, count: int) -> list[int]:
    """The passage numbers (1-based) an answer's [n] markers cite, in order of first citation."""
    out: list[int] = []
    for m in _MARKER.finditer(text):
        n = int(m.group(1))
        if 1 <= n <= count and n not in out:
            out.append(n)
    return out


def says_not_found(text: str) -> bool:
    return NOT_FOUND.lower().rstrip(".") in text.lower()
