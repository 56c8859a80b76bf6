"""The extractive answer is honest (issue 28): "Not found in the sources." when the corpus does not answer
(the relevance floor), whole sentences even where a PDF wrapped them, no headings or table scaffolding
quoted as sentences, and no sentence far below the best one. In process: the tool's handler on a real
database, hybrid (the passage's cosine counts) and lexical-only (its coverage does)."""

from __future__ import annotations

import uuid

import pytest
from helpers import db_of, make_corpus

from kdbl_api.tools.answer import answer
from kdbl_api.tools.context import Services, ToolContext
from kdbl_api.tools.models import AnswerArgs
from kdbl_core.access.principal import ALL_SCOPES, Principal, rls_transaction
from kdbl_core.access.signing import CursorCodec
from kdbl_core.search.answer import NOT_FOUND
from kdbl_core.settings import Settings
from kdbl_worker.vectorize import embed_pending

# A filing's page as PDF text comes out: lines wrapped mid-sentence, headings on lines of their own, a
# table one row a line (label | values) under its header row.
REPORT = """Northwind Traders Annual Report 2022

Human Capital

Our employees are critical to our mission of serving every customer well. As of December 31, 2022, we employed approximately
1,298,000 full-time and part-time employees. Additionally, we utilize independent contractors and temporary personnel to
supplement our workforce during the holiday season.

Our people are the heart of our culture, and we invest in their training every year.

At the end of each quarter the board reviews the results of operations with the auditors.

Liquidity and Capital Resources

Cash provided by operating activities was $46.3 billion in 2022. We regularly evaluate our cash and capital structure,
including the size, pace and form of capital returns to shareholders.

Results of Operations

Year Ended December 31, | 2022 | 2021
Total net sales | $ 469,822 | $ 386,064
Operating income | 24,879 | 22,899
"""
OTHERS = {
    "capex.txt": "Capital expenditures rose as we built fulfilment centres. Capital leases were renewed in 2021.",
    "risk.txt": "Risk Factors\n\nCompetition for qualified personnel has historically been intense in our markets.",
    "garden.txt": "Tomatoes need full sun, regular watering and support stakes in the vegetable garden.",
    "fleet.txt": "Our delivery fleet of electric vans grew to 12,000 vehicles across twenty countries.",
    "visits.txt": "Most people visit the gardens in spring, and people from the town come at the end of the week.",
    "drivers.txt": "Our drivers are local people who know every street of their town.",
}


@pytest.fixture(scope="module")
def corpus(owner_engine, worker_engine, tmp_path_factory, embedder):
    made = make_corpus(owner_engine, worker_engine, tmp_path_factory.mktemp("relevance") / "kb",
                       {"northwind-10k.txt": REPORT, **OTHERS}, tenant=f"relevance-{uuid.uuid4().hex[:8]}")
    assert embed_pending(db_of(worker_engine), embedder, tenant_id=made.tenant_id, batch=32) > 0
    return made


async def _answer(api_pool, corpus, embedder, question: str) -> dict:
    principal = Principal(tenant_id=corpus.tenant_id, tenant_name=corpus.tenant, subject="user:relevance",
                          scopes=frozenset(ALL_SCOPES))
    services = Services(settings=Settings(), cursors=CursorCodec(b"k" * 32), embedder=embedder)
    async with rls_transaction(api_pool, principal) as conn:
        result, _ = await answer(ToolContext(conn=conn, principal=principal, services=services),
                                 AnswerArgs(question=question))
    return result


@pytest.mark.parametrize("vectors", [True, False], ids=["hybrid", "lexical"])
async def test_a_question_the_corpus_cannot_answer_is_not_found_though_a_common_word_matches(
        api_pool, corpus, embedder, vectors):
    result = await _answer(api_pool, corpus, embedder if vectors else None, "What is the capital of Mongolia?")
    assert result["mode"] == ("hybrid" if vectors else "lexical")
    assert (result["found"], result["answer"], result["citations"]) == (False, NOT_FOUND, [])


@pytest.mark.parametrize("vectors", [True, False], ids=["hybrid", "lexical"])
async def test_a_one_fact_answer_quotes_the_whole_wrapped_sentence_without_heading_or_padding(
        api_pool, corpus, embedder, vectors):
    result = await _answer(api_pool, corpus, embedder if vectors else None,
                           "How many people did Northwind employ at the end of 2022?")
    assert result["found"]
    texts = [c["text"] for c in result["citations"]]
    # the sentence the page wraps after "approximately", whole, and first
    assert " ".join(texts[0].split()) == ("As of December 31, 2022, we employed approximately 1,298,000 full-time "
                                          "and part-time employees.")
    assert "Human Capital" not in texts  # the heading above it
    # sentences sharing one word with the question ("people", "end") score far below the answer's
    assert not any(t.startswith(("Our people", "At the end")) for t in texts), texts


async def test_a_table_answer_quotes_the_row_with_its_values_not_the_header_row(api_pool, corpus, embedder):
    result = await _answer(api_pool, corpus, embedder,
                           "What was Northwind's operating income for the year ended December 31, 2022?")
    texts = [c["text"] for c in result["citations"]]
    assert texts[0] == "Operating income | 24,879 | 22,899"
    assert not any(t.startswith(("Year Ended", "Results of Operations")) for t in texts), texts
