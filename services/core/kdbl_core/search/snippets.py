"""`<mark>` snippets for search hits, built in the API from the query's Postgres lexemes.

Postgres's `ts_headline` re-parses every hit's text and cost ~2.5 ms of database CPU per 20-hit search
(a quarter of the database's work per request). Here one scan per hit (in C: _scan.c; `_matches_py` is its
reference) finds the words that can stem to a query lexeme (a Snowball stem is, apart from its last letter,
a prefix of the word it came from), and only those few are stemmed with the same Snowball algorithm
Postgres's text search configuration uses, so marks land where `to_tsvector` would match. A configuration without a Snowball stemmer here
(e.g. `simple`) marks words equal to a lexeme.

Chat front ends render the snippet's `<mark>` as HTML, so everything else in it is HTML-escaped
(`&`, `<`, `>`): a document holding `<script>` shows as text, never as markup. Quotes stay as they are:
a snippet is element content, never an attribute value, and agents read it as plain text. The fragments
are chosen and written (marks, escaping, whitespace folded) in C too (_fragments.c; `_snippet_py` is its
reference): ~1.3 µs a hit against ~6-9 µs.
"""

from __future__ import annotations

import re
from html import escape
from collections.abc import Callable, Iterable
from functools import lru_cache

import Stemmer

try:
    from kdbl_core.search import _fragments, _scan
except ImportError:  # not built: the package run from its source tree
    _fragments = _scan = None

MARK, UNMARK = "<mark>", "</mark>"
FRAGMENT_CHARS = 200
MAX_FRAGMENTS = 2
DELIMITER = " … "
FALLBACK_CHARS = 240


@lru_cache(maxsize=32)
def _stemmer(ts_config: str) -> Callable[[str], str]:
    language = ts_config.rsplit(".", 1)[-1].lower()
    if language in Stemmer.algorithms():
        stem_word = Stemmer.Stemmer(language, 10000).stemWord
        return lambda word: stem_word(word.lower())
    return str.lower


@lru_cache(maxsize=256)
def _prefixes(lexemes: frozenset[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Prefixes to search for, and the lexemes that must match a whole word.

    A word can stem to a lexeme only if it starts with the lexeme less its last letter ("studi" <-
    "studies", "deliveri" <- "delivery"); a 3-letter lexeme is kept whole as the prefix ("odd" <-
    "odds"); one of 1-2 letters ("d" in "vitamin D", "0") matches a whole word only, unstemmed."""
    prefixes = tuple(sorted({lex[:-1] if len(lex) > 3 else lex for lex in lexemes if len(lex) > 2}))
    short = tuple(sorted(lex for lex in lexemes if 0 < len(lex) <= 2))
    return prefixes, short


_HTML_SPECIAL = re.compile("[&<>]")
_WORD_END = re.compile(r"[^\W_]*")  # a word runs over letters and digits ("_" separates, as in Postgres)
_STEM_CACHE_MAX = 20_000


@lru_cache(maxsize=32)
def _stem_cache(ts_config: str) -> dict[str, str]:
    """Word -> lexeme, per text search configuration (the same few words recur in every hit)."""
    return {}


def _stem(word: str, stem: Callable[[str], str], stems: dict[str, str]) -> str:
    lexeme = stems.get(word)
    if lexeme is None:
        if len(stems) >= _STEM_CACHE_MAX:
            stems.clear()
        lexeme = stems[word] = stem(word)
    return lexeme


# Compounds (kdbl_core.content.analysis: kdbl_terms, migration 0019): a word of letters and digits is also
# indexed as its parts ("FY2018": "fy", "2018"), unless it has more than MAX_BOUNDARIES letter/digit
# boundaries (a hash); "_" separates words, as in Postgres's parser.
MAX_BOUNDARIES = 3


_ASCII_DIGITS = frozenset("0123456789")
# Inside a run of letters and digits: where an ASCII digit meets another letter, either way round.
_BOUNDARIES = re.compile(r"(?<=[0-9])(?=[^\W0-9_])|(?<=[^\W0-9_])(?=[0-9])")


def _boundary(text: str, pos: int) -> bool:
    """Whether a letter meets a digit (or a digit a letter) between text[pos - 1] and text[pos]."""
    if not 0 < pos < len(text):
        return False
    before, after = text[pos - 1], text[pos]
    return before.isalnum() and after.isalnum() and (before in _ASCII_DIGITS) != (after in _ASCII_DIGITS)


def _splits(text: str, pos: int) -> bool:
    """Whether the run of letters and digits at pos is a compound that is indexed as its parts too."""
    start = pos
    while start > 0 and text[start - 1].isalnum():
        start -= 1
    end = _WORD_END.match(text, pos).end()
    return 0 < len(_BOUNDARIES.findall(text, start, end)) <= MAX_BOUNDARIES


def _part_end(text: str, pos: int) -> int:
    """The end of the part of a compound starting at pos: the next boundary or the run's end."""
    end = pos + 1
    while end < len(text) and text[end].isalnum() and not _boundary(text, end):
        end += 1
    return end


def _lowered(text: str) -> str:
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters change length when lower-cased; offsets must hold
        lowered = "".join(c if len(c.lower()) != 1 else c.lower() for c in text)
    return lowered


def _matches(text: str, lexemes: frozenset[str], ts_config: str) -> list[tuple[int, int, str]]:
    """The words of `text` that stem to one of `lexemes`: by the C scan (kdbl_core/search/_scan.c, built
    with the package), or by `_matches_py` where it was not built (a source tree on PYTHONPATH)."""
    if _scan is None:
        return _matches_py(text, lexemes, ts_config)
    prefixes, short = _prefixes(lexemes)
    return _scan.matches(_lowered(text), prefixes, short, lexemes, _stem_cache(ts_config), _stemmer(ts_config),
                         _STEM_CACHE_MAX)


def _matches_py(text: str, lexemes: frozenset[str], ts_config: str) -> list[tuple[int, int, str]]:
    """The scan in Python, the C scan's reference (tests/unit/test_snippet_scan.py holds them equal). It
    runs once per hit (10-50 a search), so its per-occurrence checks are written out: most occurrences
    are inside a longer word ("0" in "2000") and are dropped after two character tests; only a
    letter/digit boundary (a compound's part, "FY2018") asks `_splits`."""
    lowered = _lowered(text)
    prefixes, short = _prefixes(lexemes)
    stem, stems, word_end = _stemmer(ts_config), _stem_cache(ts_config), _WORD_END.match
    digits, size = _ASCII_DIGITS, len(lowered)
    found: dict[int, tuple[int, int, str]] = {}
    for prefix in prefixes:
        head = prefix[0]
        head_alnum, head_digit = head.isalnum(), head in digits
        pos = lowered.find(prefix)
        while pos != -1:
            if pos not in found:
                before = lowered[pos - 1] if pos else " "
                # a word's start, or a compound's part starting at a letter/digit boundary
                if not before.isalnum() or (head_alnum and (before in digits) != head_digit
                                            and _splits(lowered, pos)):
                    end = word_end(lowered, pos + len(prefix)).end()
                    lexeme = _stem(lowered[pos:end], stem, stems)
                    if lexeme not in lexemes and _splits(lowered, pos):  # a part of a compound (kdbl_terms)
                        end = _part_end(lowered, pos)
                        lexeme = _stem(lowered[pos:end], stem, stems)
                    if lexeme in lexemes:
                        found[pos] = (pos, end, lexeme)
            pos = lowered.find(prefix, pos + 1)
    for word in short:  # a whole word, or a whole part of a compound; str.find beats a regex with look-arounds
        head, tail, length = word[0], word[-1], len(word)
        head_alnum, head_digit, tail_alnum, tail_digit = head.isalnum(), head in digits, tail.isalnum(), tail in digits
        pos = lowered.find(word)
        while pos != -1:
            end = pos + length
            if pos not in found:
                before = lowered[pos - 1] if pos else " "
                after = lowered[end] if end < size else " "
                whole_start, whole_end = not before.isalnum(), not after.isalnum()
                if (whole_start and whole_end) or (
                        (whole_start or (head_alnum and (before in digits) != head_digit))
                        and (whole_end or (tail_alnum and (after in digits) != tail_digit))
                        and _splits(lowered, pos)):
                    found[pos] = (pos, end, word)
            pos = lowered.find(word, pos + 1)
    out: list[tuple[int, int, str]] = []
    for pos in sorted(found):  # "c-myc" also yields the lexemes "c" and "myc": mark the whole word once
        if not out or pos >= out[-1][1]:
            out.append(found[pos])
    return out


def lexeme_matches(text: str, lexemes: frozenset[str], ts_config: str) -> list[tuple[int, int, str]]:
    """(start, end, lexeme) of each word in `text` that stems to one of `lexemes`, in text order, without
    overlaps: where `to_tsvector` would match (the answer tool scores sentences with it)."""
    return _matches(text, lexemes, ts_config)


def _best_window(matches: list[tuple[int, int, str]], taken: tuple[int, int] | None) -> tuple[int, int] | None:
    """The span of at most FRAGMENT_CHARS starting at a match, clear of the `taken` span (the previous
    fragment; MAX_FRAGMENTS is 2), that covers the most
    distinct lexemes (then the most matches). Two pointers over the matches, in text order."""
    best, best_distinct, best_count = None, 0, 0
    counts: dict[str, int] = {}
    n = len(matches)
    j = 0
    for i in range(n):
        start = matches[i][0]
        if j < i:
            j, counts = i, {}
        limit = start + FRAGMENT_CHARS
        while j < n and matches[j][1] <= limit:
            lexeme = matches[j][2]
            counts[lexeme] = counts.get(lexeme, 0) + 1
            j += 1
        if j > i:
            end = matches[j - 1][1]
            distinct = len(counts)
            if (distinct > best_distinct or (distinct == best_distinct and j - i > best_count)) and (
                    taken is None or not (taken[0] < end and start < taken[1])):
                best, best_distinct, best_count = (start, end), distinct, j - i
            lexeme = matches[i][2]
            left = counts[lexeme] - 1
            if left:
                counts[lexeme] = left
            else:
                del counts[lexeme]
    return best


def _widen(text: str, start: int, end: int) -> tuple[int, int]:
    """Grow a span to about FRAGMENT_CHARS, split evenly around it, ending on word boundaries."""
    room = max(0, FRAGMENT_CHARS - (end - start)) // 2
    left = max(0, start - room)
    right = min(len(text), end + room)
    if left > 0:
        space = text.find(" ", left, start)
        left = space + 1 if space != -1 else left
    if right < len(text):
        space = text.rfind(" ", end, right)
        right = space if space != -1 else right
    return left, right


def _render(text: str, left: int, right: int, matches: Iterable[tuple[int, int, str]]) -> str:
    """text[left:right], whitespace collapsed, HTML-escaped, with the matches in <mark>."""
    if _HTML_SPECIAL.search(text, left, right) is None:  # most fragments: nothing to escape
        return _render_plain(text, left, right, matches)
    out, pos = [], left
    for start, end, _ in matches:
        if start < left or end > right:
            continue
        out += [escape(text[pos:start], quote=False), MARK, escape(text[start:end], quote=False), UNMARK]
        pos = end
    out.append(escape(text[pos:right], quote=False))
    return " ".join("".join(out).split())


def _render_plain(text: str, left: int, right: int, matches: Iterable[tuple[int, int, str]]) -> str:
    out, pos = [], left
    for start, end, _ in matches:
        if start < left or end > right:
            continue
        out += [text[pos:start], MARK, text[start:end], UNMARK]
        pos = end
    out.append(text[pos:right])
    return " ".join("".join(out).split())


def snippet(text: str, lexemes: frozenset[str], ts_config: str) -> str:
    """Up to two fragments of `text` with the query's words in <mark>; the text's opening without a match.
    Written by C (kdbl_core/search/_fragments.c) where it was built, else by `_snippet_py`, its reference."""
    matches = _matches(text, lexemes, ts_config)
    if _fragments is None:
        return _snippet_py(text, matches)
    return _fragments.snippet(text, matches, FRAGMENT_CHARS, MAX_FRAGMENTS, FALLBACK_CHARS, MARK, UNMARK, DELIMITER)


def _snippet_py(text: str, matches: list[tuple[int, int, str]]) -> str:
    """The snippet of `text` from its matches, in Python: the C writer's reference
    (tests/unit/test_snippet_fragments.py holds them equal)."""
    taken: list[tuple[int, int]] = []
    for _ in range(MAX_FRAGMENTS):
        window = _best_window(matches, taken[-1] if taken else None)
        if window is None:
            break
        taken.append(_widen(text, *window))
    if not taken:  # no match, or only words longer than a fragment
        return escape(" ".join(text[:FALLBACK_CHARS].split()), quote=False)
    merged: list[tuple[int, int]] = []
    for left, right in sorted(taken):
        if merged and left <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(right, merged[-1][1]))
        else:
            merged.append((left, right))
    return DELIMITER.join(_render(text, left, right, matches) for left, right in merged)


__all__ = ["MARK", "UNMARK", "snippet"]


PREVIEW_CHARS = 200


def preview(text: str, chars: int = PREVIEW_CHARS) -> str:
    """The chunk's first ~`chars` characters as plain text (no marks, no escaping: agents read it),
    whitespace runs folded, cut at the last word boundary with an ellipsis when longer. The snippet
    shows where the query matched; the preview shows what the chunk is about, for response_mode
    `preview` (about a fifth of the tokens of the ~1,800-character window)."""
    flat = " ".join(text.split())
    if len(flat) <= chars:
        return flat
    cut = flat.rfind(" ", chars // 2, chars)
    return flat[:cut if cut > 0 else chars].rstrip() + "…"
