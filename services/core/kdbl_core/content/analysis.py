"""How text becomes index terms, the same on the write side and the query side, and each chunk's header.

Terms: `kdbl_terms(cfg, text)` (migration 0019), in PostgreSQL: `to_tsvector`'s lexemes plus the parts of
compound ones, analysed again: at a letter/digit boundary (`fy2018` -> `fy`, `2018`; `10k` -> `10`, `k`),
at the separators of host, file and URL lexemes (`3m_2018_10k.pdf` -> `3m`, `2018`, `10k`, `pdf`, and their
parts), and a hyphenated number's signed part (`covid-19` gives `-19`, which gives `19`). So `FY2018` in a
question meets `2018` in a file name and `10-K` (`10`, `k`) meets `10K`. `TERMS` is the SQL every statement
uses, on chunks when they are written (kdbl_core.content.store) and on queries (kdbl_core.search: the keyword
arm, the snippets' lexemes, the preflight, more-like-this text, bench scale's synthetic chunks): one
definition in the database, so both sides agree by construction.

Header: every chunk is indexed with its file's header — the file name without its extension and the
folders nearest it (NAME_WORDS words), the title (TITLE_WORDS) — and its own heading path (its last
HEADING_WORDS words), their terms added to the chunk's term frequencies and its length with a weight per
field: BM25F (Robertson, Zaragoza & Taylor 2004) in its simple form, tf = sum of weight x tf per field and
the length likewise, under the body's k1 and b. A chunk on page 60 of "3M_2018_10K.pdf" that never says
"3M" or "2018" still matches both. The postings stay the only source of the keyword index, so the exact
top-k (SQL, MaxScore and the packed lists) holds as before. Measured (docs/benchmarks.md, "Long real
documents"): the weights 2 for the name and the heading path, 1 for the title — metadata titles are often
machine-written ("0001018724-21-000004", "Form 10-K for Alphabet INC filed 02/01/2022", whose filing year
is the next fiscal year's) — took the long-document eval's right-file-first from 0.497 to 0.609 (terms
alone: 0.547), SciFact's nDCG@10 from 0.697 to 0.706; the header adds ~4.6% postings, the terms ~3.5%.

The vector arm sees the header too: a chunk is embedded as `embedding_text` — the header's parts that
hold a letter (name and folders, title, heading path) on one line, a blank line, the text — so "3M 2018
10K" is part of what page 60's vector means. Measured on the long-document eval (docs/benchmarks.md):
semantic right-file-first 0.366 -> 0.447, hybrid 0.571 -> 0.590, hybrid right-page-first 0.379 -> 0.404.
A header of digits alone (SciFact's "<id>.txt") says nothing to a model and is left out. The embedding
model id carries this format (kdbl_core.embedder.CHUNK_INPUT), so vectors made before are re-embedded.

`INDEX_FORMAT` is the version of all this that a file's postings were written with (files.index_format):
the crawl re-indexes a file whose format is older (kdbl_worker.pipeline), so a change here reaches files
indexed before it at their source's next crawl. Bump it with any change to the terms or the header.
"""

from __future__ import annotations

import re

INDEX_FORMAT = 1

# The terms of a text parameter, as (term, tf) rows: `TERMS.format(text="%(query)s")`.
TERMS = "kdbl_terms(CAST(%(cfg)s AS regconfig), {text})"

# A chunk's terms on its row (migration 0021): `terms` the sorted terms joined by spaces (no term holds
# one: kdbl_terms's lexemes are the parser's tokens), `tfs` their tf in the same order: ~480 + 40 bytes for
# a 100-token chunk's 72 terms, where a text[] took 676 (4-byte headers and alignment a term).
TERMS_JOINED = "string_agg({term}, ' ' ORDER BY {term})"
TFS_JOINED = "array_agg(CAST(least({tf}, 32767) AS smallint) ORDER BY {term})"


def chunk_terms(alias: str) -> str:
    """`unnest(...) AS t(term, tf)`: the (term, tf) rows of chunk row `alias` (for a LATERAL join)."""
    return f"unnest(string_to_array({alias}.terms, ' '), {alias}.tfs) AS t(term, tf)"


def chunk_term_array(alias: str) -> str:
    """The terms of chunk row `alias` as a text[] (for @> and &&)."""
    return f"string_to_array({alias}.terms, ' ')"

NAME_WEIGHT = 2
TITLE_WEIGHT = 1
HEADING_WEIGHT = 2
NAME_WORDS = 12  # the file name and the folders nearest it: ~10 tokens in every chunk, not a long title
TITLE_WORDS = 12
HEADING_WORDS = 12

_WORD = re.compile(r"[^\W_]+")
_EXTENSION = re.compile(r"\.[A-Za-z0-9]{1,5}$")


def _first_words(text: str, n: int) -> str:
    """`text` up to the end of its `n`-th word (letters and digits), separators kept as they are."""
    if n <= 0:
        return ""
    for i, m in enumerate(_WORD.finditer(text), 1):
        if i == n:
            return text[:m.end()]
    return text


def _last_words(text: str, n: int) -> str:
    """`text` from the start of its `n`-th word from the end."""
    if n <= 0:
        return ""
    words = list(_WORD.finditer(text))
    return text[words[-n].start():] if len(words) > n else text


def file_header(key: str, title: str | None) -> list[tuple[str, int]]:
    """The file's part of every chunk's header, as (text, weight): the name without its extension, then its
    folders from the nearest (within NAME_WORDS words), and the title (within TITLE_WORDS words) unless it
    has no letter (an id like "0001018724-21-000004") or says nothing the name does not."""
    parts = [p for p in re.split(r"!/|/", key) if p]
    if parts:
        parts[-1] = _EXTENSION.sub("", parts[-1])
    path = _first_words(" / ".join(reversed(parts)), NAME_WORDS)
    out = [(path, NAME_WEIGHT)] if path else []
    if title and any(c.isalpha() for c in title):
        said = {w.lower() for w in _WORD.findall(path)}
        if {w.lower() for w in _WORD.findall(title)} - said:
            out.append((_first_words(" ".join(title.split()), TITLE_WORDS), TITLE_WEIGHT))
    return out


def heading_header(context_header: str | None) -> str | None:
    """The chunk's part of its header: its heading path, the deepest HEADING_WORDS words."""
    if not context_header:
        return None
    return _last_words(context_header, HEADING_WORDS)


def embedding_text(key: str, title: str | None, context_header: str | None, text: str) -> str:
    """What the worker embeds for a chunk: its header's parts that hold a letter and whose words a later
    part does not all repeat, joined by " | ", a blank line, the text; the text alone when no part is left."""
    parts = [part for part, _ in file_header(key, title)]
    heading = heading_header(context_header)
    if heading:
        parts.append(heading)
    kept: list[str] = []
    for i, part in enumerate(parts):
        words = {w.lower() for w in _WORD.findall(part)}
        later = {w.lower() for p in parts[i + 1:] for w in _WORD.findall(p)}
        if any(c.isalpha() for c in part) and not words <= later:  # a title the heading path repeats: once
            kept.append(part)
    return f"{' | '.join(kept)}\n\n{text}" if kept else text
