"""The snippet scan in C (kdbl_core/search/_scan.c) gives the Python reference's answer on any text.

The install builds the extension (pyproject.toml ext-modules), so the suite runs the C scan; these tests
hold it equal to `_matches_py` on generated text (letters, digits, compounds, "_", hyphens, case changes
that alter length, non-ASCII digits and letters), on hostile sizes, and check its input validation.
"""

from __future__ import annotations

import random

import pytest

from kdbl_core.search import snippets
from kdbl_core.search.snippets import _matches, _matches_py, _prefixes, _stemmer, snippet

_scan = snippets._scan

# Pieces a text is made of: words that stem alike, compounds (FY2018, covid19, 2k3x), short words,
# separators Postgres splits on, non-ASCII letters and digits (Arabic-Indic, fullwidth: alphanumeric but
# not ASCII digits), characters whose lower case is longer (İ) or differs (ẞ, Σ).
_PIECES = [
    "study", "studies", "studied", "effect", "effects", "effective", "delivery", "deliveries", "low", "lower",
    "allow", "FY2018", "fy2019", "covid19", "COVID-19", "2k3x", "a1b2c3d4", "c-myc", "myc", "d", "D", "0",
    "2000", "10mg", "mg", "x", "ab", "ba", "_", "-", " ", "  ", "\n", ".", ",", "é", "café", "Café", "İstanbul",
    "ẞ", "Σίσυφος", "٣", "１２", "abc٣def", "北京", "naïve", "ﬁne", "<script>", "&amp;", "stud", "studi",
]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) + rng.choice(["", " ", "-", "_", ".", ""]) for _ in range(rng.randint(0, 60)))


def _lexemes(rng: random.Random, text: str, ts_config: str) -> frozenset[str]:
    stem = _stemmer(ts_config)
    words = [w for w in "".join(c if c.isalnum() else " " for c in text).split()] or ["x"]
    chosen = {stem(rng.choice(words)) for _ in range(rng.randint(1, 4))}
    chosen |= {rng.choice(["d", "0", "x", "mg", "ab", "fy", "2018", "19", "covid", "myc", "c-myc", "studi", "é", "-1", "1-", "_a", "-19"])
               for _ in range(rng.randint(0, 2))}
    return frozenset(chosen)


def test_the_suite_runs_the_c_scan() -> None:
    assert _scan is not None, "kdbl_core.search._scan was not built: pip install -e . builds it (needs a C compiler)"


@pytest.mark.parametrize("ts_config", ["english", "pg_catalog.english", "simple"])
def test_c_and_python_find_the_same_matches_on_generated_text(ts_config: str) -> None:
    rng = random.Random(f"scan-{ts_config}")
    checked = found = 0
    for _ in range(1500):
        text = _text(rng)
        lexemes = _lexemes(rng, text, ts_config)
        expected = _matches_py(text, lexemes, ts_config)
        assert _matches(text, lexemes, ts_config) == expected, (text, lexemes)
        checked += 1
        found += bool(expected)
    assert checked == 1500 and found > 500  # the generator yields texts with matches, not only empty answers


def test_c_and_python_agree_on_a_text_of_a_million_characters() -> None:
    text = ("lower allowance follow yellow FY2018 2k3x low " * 22_000)[:1_000_000]
    lexemes = frozenset({"low", "fy", "2018", "k", "x"})
    matches = _matches(text, lexemes, "english")
    assert matches == _matches_py(text, lexemes, "english")
    assert len(matches) > 20_000 and all(0 <= start < end <= len(text) for start, end, _ in matches)


def test_an_empty_text_or_no_lexemes_finds_nothing() -> None:
    assert _matches("", frozenset({"studi"}), "english") == []
    assert _matches("studies of studies", frozenset(), "english") == []


def test_a_full_stem_cache_is_cleared_and_the_answer_holds() -> None:
    text = "Studies show effects of the delivery; the study was effective, deliveries late."
    lexemes = frozenset({"studi", "effect", "deliveri"})
    prefixes, short = _prefixes(lexemes)
    stems: dict[str, str] = {}
    out = _scan.matches(text.lower(), prefixes, short, lexemes, stems, _stemmer("english"), 1)
    assert out == _matches_py(text, lexemes, "english") and len(stems) == 1


def test_bad_arguments_are_refused_with_a_type_or_value_error() -> None:
    stem, lexemes = _stemmer("english"), frozenset({"studi"})
    with pytest.raises(TypeError, match="must be str"):
        _scan.matches("studies", ("stud", 3), (), lexemes, {}, stem, 10)
    with pytest.raises(TypeError):
        _scan.matches("studies", ["stud"], (), lexemes, {}, stem, 10)
    with pytest.raises(TypeError, match="callable"):
        _scan.matches("studies", ("stud",), (), lexemes, {}, None, 10)
    with pytest.raises(TypeError, match="stem must return str"):
        _scan.matches("studies", ("stud",), (), lexemes, {}, len, 10)
    with pytest.raises(ValueError, match="cache_max"):
        _scan.matches("studies", ("stud",), (), lexemes, {}, stem, 0)


def test_a_stemmer_that_raises_passes_its_error_on() -> None:
    def broken(word: str) -> str:
        raise RuntimeError(f"cannot stem {word}")

    with pytest.raises(RuntimeError, match="cannot stem studies"):
        _scan.matches("studies", ("stud",), (), frozenset({"studi"}), {}, broken, 10)


def test_snippets_are_unchanged_by_the_c_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random("snippet")
    texts = [_text(rng) * 3 for _ in range(200)]
    lexemes = [_lexemes(rng, text, "english") for text in texts]
    with_c = [snippet(text, lex, "english") for text, lex in zip(texts, lexemes)]
    monkeypatch.setattr(snippets, "_scan", None)
    assert [snippet(text, lex, "english") for text, lex in zip(texts, lexemes)] == with_c


def test_a_hostile_run_of_letters_and_digits_is_scanned_once() -> None:
    """A megabyte-long run with a letter/digit boundary at every character: each position may start a
    compound's part, and whether the run splits is asked once, not walked again at each (quadratic)."""
    text = "a1" * 1_000_000
    assert _matches(text, frozenset({"a", "1", "a1a"}), "english") == []  # > 3 boundaries: not a compound
    short = "xx " + "a1" * 300 + " a1 fy2018"
    assert _matches(short, frozenset({"a", "1", "fy", "2018"}), "english") == _matches_py(
        short, frozenset({"a", "1", "fy", "2018"}), "english")
