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
    "alpha.pdf": ["Alpha report cover page", "The ocelot census counted nine animals.", "Alpha closing notes"],
    "beta.pdf": ["Beta report cover page", "Beta revenue table follows", "The tapir survey found three."],
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


def test_the_shipped_unanswerable_set_is_well_formed_and_asks_nothing_the_eval_asks():
    from kdbl_control.eval_answers import load_unanswerable

    folder = REPO / "docs" / "eval" / "longdocs"
    declined = load_unanswerable(folder / "unanswerable.jsonl")
    asked = {q.question for q in load_questions(folder / "questions.jsonl")}
    assert len(declined) >= 50 and not {q for _, q in declined} & asked
    assert len({qid for qid, _ in declined}) == len(declined)


def test_answers_are_judged_on_questions_the_documents_answer_and_on_ones_they_do_not(owner_url, tmp_path):
    docs, questions = _folder(tmp_path)
    declined = tmp_path / "set" / "unanswerable.jsonl"
    declined.write_text(json.dumps({"id": "n-1", "question": "What is the capital of Mongolia?"}) + "\n"
                        + json.dumps({"id": "n-2", "question": "Who painted the Sistine Chapel ceiling?"}) + "\n")
    result = run_docs_eval(owner_url, docs, questions, modes=["lexical"], unanswerable=declined,
                           tenant=f"evaldocs-{uuid.uuid4().hex[:8]}")
    answers = result["answers"]
    assert (answers["answerable"], answers["unanswerable"], answers["search"]) == (3, 2, "lexical")
    assert answers["found_unanswerable"] == 0.0 and answers["answered_unanswerable"] == []  # no Mongolia, no chapel
    # a-1 is answered from alpha's page 2 ("The ocelot census counted nine animals."); b-2 asks beta about the
    # ocelot, which only alpha holds: answered, from the wrong file
    assert answers["found_answerable"] >= 1 / 3 and answers["precision_found"] == 1.0
    assert answers["cites_right_page"] == pytest.approx(1 / 3, abs=1e-4)
    assert answers["first_cites_right_page"] == pytest.approx(1 / 3, abs=1e-4)
    assert answers["sentences"] >= 1 and answers["p50_ms"] > 0 and not answers["errors"]
    assert "unanswerable" in summarise(result)


def test_an_unanswerable_id_the_questions_use_is_refused(owner_url, tmp_path):
    docs, questions = _folder(tmp_path)
    declined = tmp_path / "set" / "unanswerable.jsonl"
    declined.write_text(json.dumps({"id": "a-1", "question": "What is the capital of Mongolia?"}) + "\n")
    with pytest.raises(ConfigError, match="a-1"):
        run_docs_eval(owner_url, docs, questions, modes=["lexical"], unanswerable=declined,
                      tenant=f"evaldocs-{uuid.uuid4().hex[:8]}")


def test_hybrid_is_measured_partly_embedded_and_every_vector_is_put_back(owner_url, tmp_path, embed_model_path):
    import psycopg

    from kdbl_core.db.urls import libpq

    docs, questions = _folder(tmp_path)
    tenant = f"evaldocs-{uuid.uuid4().hex[:8]}"
    result = run_docs_eval(owner_url, docs, questions, modes=["lexical"], model_path=embed_model_path,
                           embedded_shares=[0.5, 0.8], tenant=tenant)
    assert result["modes"]["hybrid@80%"]["embedded"] == 4  # int(0.8 * 6): run first, then 50% sets one more aside
    half = result["modes"]["hybrid@50%"]
    assert half["chunks"] == result["chunks"] == 6 and half["embedded"] == 3
    assert any("3 of 6 chunks searched have vectors" in r for r in half["degraded_reasons"])
    assert half["all"]["questions"] == 3 and "misses" in half
    with psycopg.connect(libpq(owner_url)) as conn:
        row = conn.execute("SELECT count(*) FILTER (WHERE embedding IS NOT NULL AND embedding_model NOT LIKE "
                           "'hidden:%%'), count(*) FROM chunks c JOIN tenants t ON t.id = c.tenant_id "
                           "WHERE t.name = %s", (tenant,)).fetchone()
    assert row == (6, 6)
    with pytest.raises(ConfigError, match="between 0 and 1"):
        run_docs_eval(owner_url, docs, questions, modes=["lexical"], embedded_shares=[1.0], tenant=tenant)
