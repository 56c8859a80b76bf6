"""`kdbl-control eval FOLDER --questions FILE` end to end on generated PDFs: real crawl, real Postgres, the
search pipeline; every ranking is forced (each question's words are on one page of one file), so the
measures can be computed by hand. The shipped set (docs/eval/longdocs) is checked for shape only."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import pytest
from helpers import make_pdf, pdf_text_page

from kdbl_control.eval_docs import Question, load_questions, run_docs_eval, score, summarise
from kdbl_core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]

# two reports, three pages each; "ocelot" only on page 2 of alpha, "tapir" only on page 3 of beta
PAGES = {
    "alpha.pdf": ["Alpha report cover page", "The ocelot census counted nine animals", "Alpha closing notes"],
    "beta.pdf": ["Beta report cover page", "Beta revenue table follows", "The tapir survey found three"],
}
QUESTIONS = [
    {"id": "a-1", "question": "How many animals did the ocelot census count?", "file": "alpha.pdf", "pages": [2],
     "kind": "text"},  # right file, right page at rank 1
    {"id": "b-1", "question": "What did the tapir survey find?", "file": "beta.pdf", "pages": [2],
     "kind": "table"},  # right file at rank 1, the page judged is 2 but the word is on 3: page miss
    {"id": "b-2", "question": "What about the ocelot census?", "file": "beta.pdf", "pages": [2],
     "kind": "table"},  # only alpha has it: doc miss
]


def _folder(tmp_path: Path) -> tuple[Path, Path]:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, texts in PAGES.items():
        (docs / name).write_bytes(make_pdf([pdf_text_page(t) for t in texts]))
    questions = tmp_path / "set" / "questions.jsonl"
    questions.parent.mkdir()
    questions.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return docs, questions


def test_each_question_is_asked_once_and_scored_by_file_and_page(owner_url, tmp_path):
    docs, questions = _folder(tmp_path)
    result = run_docs_eval(owner_url, docs, questions, modes=["lexical"], tenant=f"evaldocs-{uuid.uuid4().hex[:8]}")
    lexical = result["modes"]["lexical"]
    overall = lexical["all"]
    assert result["questions"] == 3 and result["files"] == 2
    assert overall["doc_hit@1"] == pytest.approx(2 / 3, abs=1e-4)  # a-1, b-1
    assert overall["page_hit@10"] == pytest.approx(1 / 3, abs=1e-4)  # a-1 only
    assert overall["doc_mrr"] == pytest.approx(2 / 3, abs=1e-4) and overall["page_mrr"] == pytest.approx(1 / 3, abs=1e-4)
    assert lexical["kind:text"]["page_hit@1"] == 1.0 and lexical["kind:table"]["page_hit@1"] == 0.0
    assert lexical["group:b"]["doc_hit@10"] == 0.5
    assert lexical["misses"] == ["b-2"]
    assert "doc@1" in summarise(result)


def test_a_manifest_that_does_not_match_the_documents_stops_the_eval(owner_url, tmp_path):
    docs, questions = _folder(tmp_path)
    (questions.parent / "manifest.json").write_text(json.dumps({"documents": {
        "alpha.pdf": {"sha256": hashlib.sha256(b"other bytes").hexdigest()}}}))
    with pytest.raises(ConfigError, match="alpha.pdf \\(sha256 differs\\)"):
        run_docs_eval(owner_url, docs, questions, modes=["lexical"])


def test_scores_by_hand():
    q = Question(id="a-1", question="?", file="alpha.pdf", pages=frozenset({2}), kind="text", group="a")
    measured = score([q], {"a-1": [("beta.pdf", 2), ("alpha.pdf", 1), ("alpha.pdf", 2)]})
    assert (measured["doc_hit@1"], measured["doc_hit@5"], measured["doc_mrr"]) == (0.0, 1.0, 0.5)
    assert (measured["page_hit@1"], measured["page_hit@5"], measured["page_mrr"]) == (0.0, 1.0, round(1 / 3, 4))


def test_bad_question_files_are_refused_naming_the_line(tmp_path):
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"id": "x", "question": "?", "file": "a.pdf", "pages": [1]}\n{"id": "y", "question": "?"}\n')
    with pytest.raises(ConfigError, match="q.jsonl:2"):
        load_questions(bad)
    bad.write_text('{"id": "x", "question": "?", "file": "a.pdf", "pages": []}\n')
    with pytest.raises(ConfigError, match="lists no page"):
        load_questions(bad)


def test_the_shipped_long_document_set_is_well_formed():
    folder = REPO / "docs" / "eval" / "longdocs"
    questions = load_questions(folder / "questions.jsonl")
    manifest = json.loads((folder / "manifest.json").read_text())["documents"]
    assert len(questions) >= 100
    assert {q.file for q in questions} <= set(manifest)
    assert all(len(meta["sha256"]) == 64 for meta in manifest.values())
