"""The API-side snippet marks the words Postgres's text search matches for the query.

PyStemmer ships a newer Snowball English than Postgres 18 (e.g. "interfering": "interfer" vs "interf",
"oncologist": "oncolog" vs "oncologist"): ~0.2% of SciFact's vocabulary stems differently, so the test
bounds the disagreement instead of demanding none; a marked word is never one Postgres would not match.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import text

from kdbl_core.search.snippets import MARK, snippet

SCIFACT = Path(__file__).resolve().parents[3] / "shared" / "data" / "scifact"
_WORD = re.compile(r"\w+")


def _samples() -> list[tuple[str, str]]:
    corpus, queries = SCIFACT / "corpus.jsonl", SCIFACT / "queries.jsonl"
    if not corpus.exists():
        pytest.skip(f"SciFact data not found at {SCIFACT}")
    with corpus.open() as fh:
        docs = [json.loads(next(fh))["text"] for _ in range(60)]
    with queries.open() as fh:
        qs = [json.loads(next(fh))["text"] for _ in range(60)]
    return list(zip(qs, docs, strict=True))


def test_marks_agree_with_to_tsvector(owner_engine) -> None:
    checked = marked = missed = 0
    with owner_engine.connect() as conn:
        def lexemes(value: str) -> set[str]:
            return set(conn.execute(text("SELECT lexeme FROM unnest(to_tsvector('english', :v))"),
                                    {"v": value}).scalars())

        for query, doc in _samples():
            wanted = frozenset(lexemes(query) | lexemes(doc.split(". ")[0]))  # make sure some words match
            out = snippet(doc, wanted, "english")
            for piece in out.split(MARK)[1:]:
                word = piece.split("</mark>", 1)[0]
                assert lexemes(word) & wanted, f"{word!r} marked but Postgres does not match it"
                marked += 1
            unmarked = re.sub(r"<mark>.*?</mark>", " ", out)
            for word in set(_WORD.findall(unmarked)):
                missed += bool(lexemes(word) & wanted)
                checked += 1
    assert marked > 100 and checked > 1000
    assert missed / (marked + missed) < 0.02, f"{missed} of {marked + missed} matching words left unmarked"
