"""The API-side snippet marks the words Postgres's text search matches for the query.

PyStemmer ships a newer Snowball English than Postgres 18 (e.g. "interfering": "interfer" vs "interf",
"oncologist": "oncolog" vs "oncologist"): a fraction of a percent of an English vocabulary stems
differently, so the test bounds the disagreement instead of demanding none; a marked word is never
one Postgres would not match. The English text is the repository's own documentation (60 paragraphs,
README and docs/, each queried with the first sentence of another), so the test needs nothing
outside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import text

from kdbl_core.search.snippets import MARK, snippet

DOCS = Path(__file__).resolve().parents[2] / "docs"
_WORD = re.compile(r"\w+")


def _samples() -> list[tuple[str, str]]:
    paragraphs = []
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for block in page.read_text().split("\n\n"):
            block = " ".join(re.sub(r"`[^`]*`|\(?https?://\S+|[*_|]", " ", block).split())  # prose, not code
            if len(block) > 150 and not block.startswith(("|", "#", "```")):
                paragraphs.append(block)
    docs = paragraphs[:60]
    assert len(docs) == 60, f"only {len(docs)} prose paragraphs in {DOCS}"
    queries = [docs[(i + 7) % len(docs)].split(". ")[0] for i in range(len(docs))]
    return list(zip(queries, docs, strict=True))


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
    print(f"\n{missed} of {marked + missed} matching words left unmarked, {checked} words checked")
    assert missed / (marked + missed) < 0.02, f"{missed} of {marked + missed} matching words left unmarked"
