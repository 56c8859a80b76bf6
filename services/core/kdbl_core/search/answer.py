"""Grounded answers from what the caller's search returned: the `answer` tool's core.

Both kinds start from one search (a kdbl_core.search.plan.SearchPlan, in the caller's RLS
transaction: only what the principal may see is ever read) and the matched chunks of its top ANSWER_HITS
hits, each an exact slice `text[char_start:char_end]` of its file's extracted text (the chunker's
invariant), so a sentence's offsets in its chunk plus the chunk's char_start are its offsets in the file:
get_file_text's text[start:end] is the cited sentence, character for character.

Sentences (`sentence_spans`): a line end a PDF or a hard-wrapped file puts inside a sentence does not end
it ("we employed approximately\n1,298,000 full-time ..."), nor does an abbreviation's period ("U.S. and").
Only statements are candidates (`is_statement`): prose, or a table row with its label and values; never a
heading ("Liquidity and Capital Resources"), a table's header row ("Year Ended December 31, | 2022 | 2021")
or scaffolding — a row is read with its header row's words, so "operating income in 2022" finds the row.

Sentences are scored against the question (`score_sentences`): BM25 over the candidate sentences, the
question's terms (kdbl_terms, the index's analysis) matched by the same Snowball stemming the snippets use
(snippets.lexeme_matches; stop words never count), each weighted by its rarity among the candidates (idf),
term frequency saturated (k1 1.2) and length-normalised (b 0.75); times (1 + the share of the question's
weight the sentence matches); times a position prior, 5% less per hit rank and 2% less per sentence into
the chunk (both capped at 10).

The relevance floor (`relevant`), measured on the long-document eval's 161 questions and 55 the corpus
cannot answer (docs/benchmarks.md: `found` on the unanswerable 65% -> 11%, on the answerable 96% -> 98%):
the question's terms are weighed by their idf over the chunks the caller sees (`term_weights`: a term no
chunk holds weighs most, so "the capital of Mongolia" is not covered by "capital resources"; "how many",
"how much" weigh nothing); a sentence answers when it covers MIN_COVERAGE of that weight, its file's name,
title and heading path counting for it ("Northwind" in the file name), and its passage is about the
question — the chunk's cosine to it (hybrid's explain) at least MIN_SIMILARITY, or without one, the chunk
covering MIN_PASSAGE_COVERAGE. When no sentence is relevant the answer is NOT_FOUND with no citation. An
answer keeps the relevant sentences scoring at least RELATIVE_CUT of the best one's: a one-fact answer
is not padded with sentences that share a word with the question.

extractive: the best relevant sentences, best first, each with its citation, until max_tokens (tokens
estimated as characters / 4, as no model need be loaded; one over-long sentence is cut, its range with
it). abstractive: the chunks holding relevant sentences become numbered passages, the only context the
chat model gets (`messages`); its [n] markers become citations (`cited`). Measured in docs/benchmarks.md:
an extractive answer's p50 latency over 30 SciFact-like questions.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from kdbl_core.content.records import Chunk
from kdbl_core.db.async_pool import Connection
from kdbl_core.embedder import Embedder
from kdbl_core.search import lexical, pipeline
from kdbl_core.search.plan import SearchPlan
from kdbl_core.search.lexical import Filters
from kdbl_core.search.snippets import lexeme_matches
from kdbl_core.settings import Settings

ANSWER_HITS = 8  # hits whose chunks are read: the top of the ranking holds the answer when there is one
NOT_FOUND = "Not found in the sources."
# The relevance floor (measured in docs/benchmarks.md: the long-document eval's 161 questions, which the
# corpus answers, and 55 it cannot): a sentence is an answer when it covers MIN_COVERAGE of the question's
# weight (each lexeme's idf over the corpus) and its passage is about the question — its cosine to the
# question at least MIN_SIMILARITY where the search knows it, else the passage covers MIN_PASSAGE_COVERAGE.
MIN_COVERAGE = 0.3
MIN_SIMILARITY = 0.45
MIN_PASSAGE_COVERAGE = 0.6
RELATIVE_CUT = 0.5  # an answer's sentences score at least this share of its best one's
# the form of a question, not its subject, and no stop words to Postgres: they weigh nothing
QUESTION_WORDS = frozenset({"mani", "much"})
MAX_SENTENCES = 8
DEFAULT_MAX_TOKENS = 512  # the answer tool's max_tokens when not given
CHARS_PER_TOKEN = 4
K1, B = 1.2, 0.75

# The hits' matched chunks (not the neighbour windows: those are cut with ellipses), and the question's
# lexemes, under the caller's RLS.
_CHUNKS = """
SELECT h.ord, c.text, c.char_start, c.char_end, c.page_no, c.ts_start_ms, c.ts_end_ms,
       concat_ws(' ', f.title, c.context_header) AS context,
       (SELECT array_agg(DISTINCT t.term) FROM kdbl_terms(CAST(%(cfg)s AS regconfig), %(query)s) AS t) AS lexemes
  FROM unnest(CAST(%(sids)s AS uuid[]), CAST(%(keys)s AS text[]), CAST(%(seqs)s AS int[]))
       WITH ORDINALITY AS h(source_id, key, seq, ord)
  JOIN files f ON f.source_id = h.source_id AND f.key = h.key
  JOIN chunks c ON c.file_id = f.id AND c.seq = h.seq
 ORDER BY h.ord
"""
# Each given term's idf over the chunks the caller sees (the BM25 statistics, kdbl_core.search.lexical), and
# the number of those chunks (the row without a term): what a term in no chunk would weigh.
_WEIGHTS = (lexical.TERMS.replace(lexical.QUERY_LEXEMES, lexical.GIVEN_TERMS, 1)
            + "\nSELECT w.term, w.idf FROM w UNION ALL SELECT NULL, corpus.n FROM corpus")

# a sentence ends at . ! ? or 。 followed by white space, or at a line end
_SENTENCE_END = re.compile(r"[.!?。]+(?=\s)|\n")
_WORD = re.compile(r"\w+")
_LETTERS = re.compile(r"[^\W\d_]{2,}")  # a word of two letters or more
# a value a table row states: an amount ($, thousands separators, decimals, %), a number of 3+ digits
# that is not a year (19xx, 20xx)
_VALUE = re.compile(r"[$€£¥]|\d\.\d|\d{1,3}(?:,\d{3})+|\d%|\b(?!(?:19|20)\d{2}\b)\d{3,}\b")
_COMPOUND = re.compile(r"(?=.*[^\W\d_])(?=.*\d)\w+")  # letters and digits in one word: fy2018, 10k, 3m
_CLOSERS = "\"')]’”»"
_PROSE_END = (".", "!", "?", "。", ":", ";")
MIN_PROSE_WORDS = 3
MIN_LINE_WORDS = 8
WRAP_CHARS = 40  # a line this long that does not end a sentence may wrap one
_BULLETS = "•·◦▪-–—*#"
_CELL = " | "  # how extraction joins a table row's cells (kdbl_worker.extract.tables)
_LAST_WORD = re.compile(r"[\w.]+$")
_INITIALS = re.compile(r"(?:[A-Za-z]\.){2,}")  # U.S., N.A., e.g., i.e.
_ABBREVIATIONS = frozenset({"v", "vs", "inc", "corp", "co", "ltd", "llc", "no", "nos", "mr", "mrs", "ms", "dr",
                            "st", "jr", "sr", "fig", "figs", "al", "etc", "approx", "dept", "est", "vol", "p",
                            "pp", "sec", "art"})
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
    similarity: float | None = None  # the chunk's cosine to the question (hybrid's explain), None: unknown
    context: str = ""  # what places the chunk: its file's title and the heading path above it (the key apart)

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
    passage_coverage: float = 1.0  # the share of the question's weight its passage (chunk) matches


async def ground(conn: Connection, question: str, *, settings: Settings, embedder: Embedder | None,
                 filters: Filters | None = None, allowed_modes: tuple[str, ...] | frozenset[str] = pipeline.MODES,
                 timings: dict[str, float] | None = None) -> tuple[pipeline.SearchResult, list[Sentence]]:
    """What both kinds of answer start from: one search (hybrid, degrading as search_content does; explain
    gives each hit's cosine) for ANSWER_HITS hits, and their sentences scored, best first. `timings`
    (the tool's took_ms) gets the search's parts and "sentences" (ms)."""
    request = pipeline.SearchRequest(query=question, mode="hybrid", limit=ANSWER_HITS,
                                     filters=filters or Filters(), explain=True)
    result = await SearchPlan(request, settings=settings, embedder=embedder,
                              allowed_modes=allowed_modes).run(conn, timings=timings)
    lap = time.perf_counter()
    found, lexemes = await passages(conn, result.hits, question=question, ts_config=settings.text_search_config)
    weights = await term_weights(conn, lexemes) if found else {}
    sentences = score_sentences(found, lexemes, settings.text_search_config, weights)
    if timings is not None:
        timings["sentences"] = timings.get("sentences", 0.0) + (time.perf_counter() - lap) * 1000
    return result, sentences


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
            row["ts_end_ms"]), (hit.get("explain") or {}).get("vector_score"), row["context"] or ""))
    return out, lexemes


async def term_weights(conn: Connection, lexemes: frozenset[str]) -> dict[str, float]:
    """Each lexeme's idf over the chunks the caller sees. One no visible chunk holds weighs most (the idf
    of a term in none): a question about what the corpus never mentions is covered by no sentence. A
    compound of letters and digits in no chunk ("fy2018") weighs nothing: the corpus writes it apart
    ("fiscal 2018"), and its parts, where the query's terms hold them, speak for it."""
    if not lexemes:
        return {}
    rows = await lexical.fetch_generic(conn, _WEIGHTS, {"terms": sorted(lexemes)})
    n = next((float(r.idf) for r in rows if r.term is None), 1.0)
    known = {r.term: float(r.idf) for r in rows if r.term is not None}
    absent = math.log(1 + (n + 0.5) / 0.5)
    return {lexeme: 0.0 if lexeme in QUESTION_WORDS else known.get(lexeme, 0.0 if _COMPOUND.fullmatch(lexeme) else absent)
            for lexeme in lexemes}


def _wrapped(text: str, pos: int) -> bool:
    """Whether the line end at text[pos] only wraps a line of a paragraph (PDF text and hard-wrapped files
    break sentences at line ends: "we employed approximately\n1,298,000 full-time ..."): the line before
    is a long one that does not end a sentence, neither is a heading (mostly capitalised words) or a table
    row (" | "), and the next does not open a list item."""
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos + 1)
    before, after = text[start:pos].strip(), text[pos + 1:len(text) if end < 0 else end].strip()
    if len(before) < WRAP_CHARS or not after or before.rstrip(_CLOSERS).endswith(_PROSE_END):
        return False
    if _CELL in before or _CELL in after or after[0] in _BULLETS:
        return False
    words = _LETTERS.findall(before)
    return not (len(words) < MIN_LINE_WORDS + 4 and sum(1 for w in words if w[0].isupper()) >= 0.6 * len(words))


def _abbreviation(text: str, dot: int, after: int) -> bool:
    """Whether the period at text[dot] ends an abbreviation, not a sentence: "U.S.", "Inc.", "e.g.", or
    any period the next word goes on from in lower case ("filed U.S. and international")."""
    word = _LAST_WORD.search(text, max(0, dot - 12), dot)
    if word and (word.group().lower() in _ABBREVIATIONS or _INITIALS.fullmatch(word.group() + ".")):
        return True
    following = text[after:after + 40].lstrip()
    return bool(following) and following[0].islower()


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each sentence of `text`, white space trimmed; blank pieces left out. A line end
    ends a sentence unless it only wraps a line (_wrapped)."""
    spans, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        if m.group() == "\n":
            if _wrapped(text, m.start()):
                continue
        elif m.group() == "." and _abbreviation(text, m.start(), m.end()):
            continue
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


def is_statement(text: str) -> bool:
    """Whether a sentence may be quoted as an answer: prose (it ends as a sentence ends and has at least
    MIN_PROSE_WORDS words), a table row (a label and a value: "Total net sales $ 394,328"), or a long line
    of ordinary words (MIN_LINE_WORDS or more, not in title case: a sentence a PDF broke at a line end).
    Not a heading ("# Vitamin D", "Liquidity and Capital Resources", "Item 7."), a table's header row or
    scaffolding ("Year Ended December 31,", "2022 2021 2020", "(In millions)")."""
    stripped = text.strip()
    if stripped.startswith("#"):
        return False
    words = _LETTERS.findall(stripped)
    if stripped.rstrip(_CLOSERS).endswith(_PROSE_END) and len(words) >= MIN_PROSE_WORDS:
        return True
    if words and _VALUE.search(stripped):
        return True
    capitalised = sum(1 for w in words if w[0].isupper())
    return len(words) >= MIN_LINE_WORDS and capitalised < 0.6 * len(words)


def score_sentences(found: Sequence[Passage], lexemes: frozenset[str], ts_config: str,
                    weights: Mapping[str, float] | None = None) -> list[Sentence]:
    """Every statement (is_statement) of the passages that matches a question lexeme, scored (module
    docstring), best first; a sentence seen already (the same text in another hit) is left out. `weights`
    (term_weights: idf over the corpus) weigh the coverage; without them, the candidates' own idf does."""
    if not lexemes:
        return []
    candidates: list[tuple[Passage, int, int, int, dict[str, int], int]] = []
    in_passage: dict[int, set[str]] = {}  # the lexemes each passage matches, its headings and rows included
    placed: dict[int, set[str]] = {}  # the lexemes of what places each passage: file name, title, headings
    for passage in found:
        where = f"{passage.key.rsplit('/', 1)[-1]} {passage.context}"
        placed[passage.rank] = {lexeme for _, _, lexeme in lexeme_matches(where, lexemes, ts_config)}
        matched = in_passage.setdefault(passage.rank, set(placed[passage.rank]))
        header: dict[str, int] = {}  # the matches of the table header row above (a row is read under it)
        for position, (s, e) in enumerate(sentence_spans(passage.text)):
            counts: dict[str, int] = {}
            for _, _, lexeme in lexeme_matches(passage.text[s:e], lexemes, ts_config):
                counts[lexeme] = counts.get(lexeme, 0) + 1
            matched.update(counts)
            row = _CELL in passage.text[s:e]
            if not is_statement(passage.text[s:e]):
                if row:
                    header = counts
                continue
            if not row:
                header = {}
            elif counts:  # a row its own label matches is read with its header's words (its period)
                counts = {lexeme: counts.get(lexeme, 0) + header.get(lexeme, 0) for lexeme in {*counts, *header}}
            length = max(1, len(_WORD.findall(passage.text, s, e)))
            candidates.append((passage, s, e, position, counts, length))
    n = len(candidates)
    if not n:
        return []
    df = {lexeme: sum(1 for c in candidates if lexeme in c[4]) for lexeme in lexemes}
    idf = {lexeme: math.log(1 + (n - df[lexeme] + 0.5) / (df[lexeme] + 0.5)) for lexeme in lexemes}
    weight = idf if weights is None else {lexeme: weights.get(lexeme, 0.0) for lexeme in lexemes}
    total_weight = math.fsum(weight.values()) or 1.0  # fsum: the same sum whatever the set's order (hash seed)
    avg_length = sum(c[5] for c in candidates) / n
    scored, seen = [], set()
    for passage, s, e, position, counts, length in candidates:
        if not counts:
            continue
        norm = K1 * (1 - B + B * length / avg_length)
        bm25 = sum(idf[lex] * tf * (K1 + 1) / (tf + norm) for lex, tf in counts.items())
        own = math.fsum(weight[lex] for lex in counts) / total_weight  # the sentence's words: its score
        # the floor's: what its file name, title and headings say counts too ("Northwind" in the file name)
        coverage = math.fsum(weight[lex] for lex in placed[passage.rank].union(counts)) / total_weight
        prior = (1 - 0.05 * min(passage.rank, 10)) * (1 - 0.02 * min(position, 10))
        text = passage.text[s:e]
        if text in seen:
            continue
        seen.add(text)
        scored.append(Sentence(passage, passage.char_start + s, passage.char_start + e, text,
                               bm25 * (1 + own) * prior, coverage,
                               math.fsum(weight[lex] for lex in in_passage[passage.rank]) / total_weight))
    scored.sort(key=lambda x: -x.score)
    return scored


def relevant(sentences: Sequence[Sentence]) -> list[Sentence]:
    """The sentences above the relevance floor (MIN_COVERAGE and the passage's, above), best first."""
    return [s for s in sentences if s.coverage >= MIN_COVERAGE and (
        s.passage.similarity >= MIN_SIMILARITY if s.passage.similarity is not None
        else s.passage_coverage >= MIN_PASSAGE_COVERAGE)]


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def extractive(sentences: Sequence[Sentence], *, max_tokens: int) -> tuple[list[Sentence], bool]:
    """The relevant sentences that fit max_tokens (estimated), best first; whether one was cut to fit.
    Each cited sentence costs its text and its " [n]" marker."""
    chosen: list[Sentence] = []
    used = 0
    kept = relevant(sentences)
    floor = RELATIVE_CUT * kept[0].score if kept else 0.0
    for sentence in [s for s in kept if s.score >= floor][:MAX_SENTENCES]:
        cost = estimate_tokens(sentence.text) + 2
        if used + cost <= max_tokens:
            chosen.append(sentence)
            used += cost
            continue
        if not chosen:  # the best sentence alone is too long: its head, with its range cut to match
            keep = max(1, (max_tokens - 2) * CHARS_PER_TOKEN)
            chosen.append(Sentence(sentence.passage, sentence.start, sentence.start + keep, sentence.text[:keep],
                                   sentence.score, sentence.coverage, sentence.passage_coverage))
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
