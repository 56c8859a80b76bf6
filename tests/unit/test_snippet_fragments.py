"""The snippet's fragment writer in C (kdbl_core/search/_fragments.c) writes the Python reference's string.

The install builds the extension (setup.py), so the suite runs the C writer; these tests hold it equal to
`_snippet_py` on matches from the real scan over generated text (HTML specials, every kind of whitespace
str.split folds, 1-, 2- and 4-byte strings), on made-up match lists that exercise the window choice's ties,
on hostile sizes, and check its input validation.
"""

from __future__ import annotations

import random

import pytest

from kdbl_core.search import snippets
from kdbl_core.search.snippets import (
    DELIMITER, FALLBACK_CHARS, FRAGMENT_CHARS, MARK, MAX_FRAGMENTS, UNMARK, _matches, _snippet_py, _stemmer, snippet,
)

_fragments = snippets._fragments

# Whitespace str.split() folds, beyond the ASCII ones: NEL, NBSP, the information separators, ideographic space.
_SPACES = [" ", "  ", "\n", "\t", "\r\n", "\x0b", "\x0c", "\x85", "\xa0", "\x1c", "\x1f", "\u2003", "\u3000"]
_WORDS = ["study", "studies", "effect", "effective", "vitamin", "D", "dose", "doses", "FY2018", "c-myc", "x", "<b>",
          "a&b", "->", "<mark>", "&amp;", "café", "naïve", "İstanbul", "北京", "😀", "𝔘nicode", "studied", "mg", "10mg"]
_LEXEMES = ["studi", "effect", "vitamin", "d", "dose", "fy", "2018", "myc", "caf", "naïv", "x", "mg", "北京"]


def _text(rng: random.Random, words: int) -> str:
    return "".join(rng.choice(_WORDS) + rng.choice(_SPACES) for _ in range(words))


def _c(text: str, matches: list, **sizes: int) -> str:
    return _fragments.snippet(text, matches, sizes.get("width", FRAGMENT_CHARS), sizes.get("fragments", MAX_FRAGMENTS),
                              sizes.get("fallback", FALLBACK_CHARS), MARK, UNMARK, DELIMITER)


def test_the_suite_runs_the_c_writer() -> None:
    assert _fragments is not None, "kdbl_core.search._fragments was not built: pip install -e . builds it"


@pytest.mark.parametrize("ts_config", ["english", "simple"])
def test_c_and_python_write_the_same_snippet_of_scanned_text(ts_config: str) -> None:
    rng = random.Random(f"fragments-{ts_config}")
    stem = _stemmer(ts_config)
    marked = fallback = 0
    for _ in range(1500):
        text = _text(rng, rng.choice([0, 1, 5, 30, 120, 400]))
        lexemes = frozenset(rng.sample(_LEXEMES, rng.randint(1, 5)) + [stem(rng.choice(_WORDS))])
        matches = _matches(text, lexemes, ts_config)
        expected = _snippet_py(text, matches)
        assert _c(text, matches) == expected, (text, lexemes)
        marked += MARK in expected
        fallback += not matches
    assert marked > 800 and fallback > 50  # both paths: fragments with marks, and the fallback opening


def _made_up_matches(rng: random.Random, size: int) -> list[tuple[int, int, str]]:
    out, pos = [], 0
    while True:
        pos += rng.choice([0, 1, 2, 5, 20, 90, 190, 260])
        length = rng.choice([1, 3, 8, 150, 199, 200, 201, 400])
        if pos + length > size:
            return out
        out.append((pos, pos + length, rng.choice("abcd")))  # few lexemes: many ties on distinct and count
        pos += length


def test_made_up_matches_choose_the_same_windows() -> None:
    """Windows at the width's edge, matches longer than a fragment, ties, more fragments than two."""
    rng = random.Random("windows")
    for _ in range(2000):
        text = _text(rng, rng.randint(0, 300))
        matches = _made_up_matches(rng, len(text))
        width, fragments = rng.choice([1, 50, 200, 201, 1000]), rng.choice([0, 1, 2, 3, 5])
        fallback = rng.choice([0, 1, 240, 10_000])
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(snippets, "FRAGMENT_CHARS", width)
            patch.setattr(snippets, "MAX_FRAGMENTS", fragments)
            patch.setattr(snippets, "FALLBACK_CHARS", fallback)
            expected = _snippet_py(text, matches)
        assert _c(text, matches, width=width, fragments=fragments, fallback=fallback) == expected, (
            text, matches, width, fragments)


def test_hostile_sizes() -> None:
    rng = random.Random("big")
    text = _text(rng, 200_000)  # ~1.6 MB, every string kind
    matches = _matches(text, frozenset(_LEXEMES), "english")
    assert len(matches) > 50_000
    assert _c(text, matches) == _snippet_py(text, matches)
    run = "<" * 2_000_000  # one long run of characters to escape, no space to widen on
    assert _c(run, [(1_000_000, 1_000_001, "x")]) == _snippet_py(run, [(1_000_000, 1_000_001, "x")])
    assert _c(run, []) == "&lt;" * FALLBACK_CHARS


def test_snippet_is_the_same_with_and_without_c(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "Vitamin D <doses> &\u3000effects:\x85 studies of vitamin D in 2018 (FY2018) " * 20
    lexemes = frozenset({"vitamin", "d", "dose", "2018", "studi"})
    with_c = snippet(text, lexemes, "english")
    monkeypatch.setattr(snippets, "_fragments", None)
    assert snippet(text, lexemes, "english") == with_c
    assert "<mark>Vitamin</mark> <mark>D</mark> &lt;<mark>doses</mark>&gt; &amp; effects:" in with_c


@pytest.mark.parametrize(("matches", "error"), [
    ([(0, 1)], TypeError),
    ([[0, 1, "a"]], TypeError),
    ([(0, 1, b"a")], TypeError),
    ([("0", 1, "a")], TypeError),
    ([(0, 11, "a")], ValueError),  # past the text
    ([(-1, 1, "a")], ValueError),
    ([(3, 2, "a")], ValueError),
    ([(4, 6, "a"), (0, 2, "b")], ValueError),  # out of order
    ([(0, 4, "a"), (3, 6, "b")], ValueError),  # overlapping
    ([(0, 2**70, "a")], OverflowError),
])
def test_bad_matches_are_refused(matches: list, error: type[Exception]) -> None:
    with pytest.raises(error):
        _c("0123456789", matches)


@pytest.mark.parametrize("sizes", [{"width": 0}, {"width": 2**31}, {"fragments": -1}, {"fallback": -1},
                                   {"fragments": 2**31}])
def test_bad_sizes_are_refused(sizes: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        _c("some text", [(0, 4, "some")], **sizes)
    with pytest.raises(TypeError):
        _fragments.snippet("text", ((0, 4, "text"),), 200, 2, 240, MARK, UNMARK, DELIMITER)  # a tuple, not a list
