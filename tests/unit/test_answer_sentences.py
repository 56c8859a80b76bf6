"""kdbl_core.search.answer without a database: sentence spans, their scores against the question's lexemes,
the max_tokens budget, the abstractive prompt's budget and the [n] citations read back."""

from __future__ import annotations

from kdbl_core.content.records import Chunk
from kdbl_core.search import answer
from kdbl_core.search.answer import Passage

CFG = "pg_catalog.english"


def passage(text: str, rank: int = 0, char_start: int = 100, key: str = "a.md") -> Passage:
    return Passage(rank, "00000000-0000-0000-0000-000000000001", key, Chunk(rank, text, char_start,
                                                                             char_start + len(text)))


def test_sentence_spans_trim_white_space_and_keep_decimals_and_lines_apart():
    text = "  Dose was 2.5 mg daily.  Risk fell!\nA list line\n\n  Why? Because."
    spans = [text[s:e] for s, e in answer.sentence_spans(text)]
    assert spans == ["Dose was 2.5 mg daily.", "Risk fell!", "A list line", "Why?", "Because."]


def test_sentences_are_scored_by_matched_question_lexemes_and_their_file_offsets_are_exact():
    p = passage("The garden has roses. Vitamin D deficiency raises fracture risk in elderly patients. "
                "Vitamin pills are sold here.")
    scored = answer.score_sentences([p], frozenset({"vitamin", "d", "defici", "fractur", "risk"}), CFG)
    best = scored[0]
    assert best.text == "Vitamin D deficiency raises fracture risk in elderly patients."
    assert p.text[best.start - p.char_start:best.end - p.char_start] == best.text
    assert [s.text for s in scored] == [best.text, "Vitamin pills are sold here."]  # roses match nothing
    assert best.coverage == 1.0 and scored[1].coverage < answer.MIN_COVERAGE
    assert answer.relevant(scored) == [best]


def test_a_higher_ranked_hit_wins_a_tie_and_a_repeated_sentence_is_kept_once():
    same = "Heliostats track the sun."
    scored = answer.score_sentences([passage(same, rank=3, key="b.md"), passage(same, rank=0)],
                                    frozenset({"heliostat", "sun"}), CFG)
    assert len(scored) == 1 and scored[0].passage.rank == 3  # the first seen is kept; same text once
    a, b = passage("Heliostats track the sun.", rank=0), passage("Heliostats track the sun daily.", rank=5, key="b.md")
    ranked = answer.score_sentences([b, a], frozenset({"heliostat", "sun"}), CFG)
    assert ranked[0].passage.rank == 0


def test_the_extractive_answer_keeps_within_max_tokens_and_cuts_a_lone_long_sentence_with_its_range(monkeypatch):
    monkeypatch.setattr(answer, "RELATIVE_CUT", 0.0)  # the budget alone: the second sentence scores far below
    long = "Vitamin " + "d and " * 100 + "bones end."
    scored = answer.score_sentences([passage(long)], frozenset({"vitamin", "d"}), CFG)
    chosen, cut = answer.extractive(scored, max_tokens=16)
    assert cut and len(chosen) == 1
    only = chosen[0]
    assert answer.estimate_tokens(only.text) + 2 <= 16 and only.end - only.start == len(only.text)
    assert long.startswith(only.text)
    two = answer.score_sentences([passage("Vitamin D helps bones."), passage(long, rank=1, key="b.md")],
                                 frozenset({"vitamin", "d", "bone"}), CFG)
    assert [len(answer.extractive(two, max_tokens=m)[0]) for m in (16, 4096)] == [1, 2]  # the second did not fit
    assert answer.extractive(two, max_tokens=16) == ([two[0]], False)


def test_the_prompt_numbers_only_the_passages_that_fit_the_budget():
    ps = [passage("alpha " * 50, rank=i, key=f"{i}.md") for i in range(4)]
    count = len  # a character a token
    messages, kept = answer.messages("what is alpha?", ps, budget_tokens=900, count_tokens=count)
    assert 1 <= len(kept) < 4 and kept == ps[:len(kept)]
    user = messages[1]["content"]
    assert f"[{len(kept)}] ({kept[-1].key})" in user and f"[{len(kept) + 1}]" not in user
    assert len(messages[0]["content"]) + 32 + len(user) <= 900
    assert "Not found in the sources." in messages[0]["content"]
    assert answer.messages("q", ps, budget_tokens=50, count_tokens=count)[1] == []


def test_citations_are_the_passage_numbers_the_answer_cites_in_range():
    assert answer.cited("Risk rises [2]. Also [1][2], not [9] or [0].", 3) == [2, 1]
    assert answer.says_not_found("not found in the sources") and not answer.says_not_found("Found it [1].")


def test_headings_table_header_rows_and_scaffolding_are_not_statements_but_a_row_with_values_is():
    for text in ("# Vitamin D", "Liquidity and Capital Resources", "Item 7.", "Year Ended December 31, | 2022 | 2021",
                 "2022 2021 2020", "(In millions)",
                 "Management's Discussion and Analysis of Financial Condition and Results of Operations"):
        assert not answer.is_statement(text), text
    for text in ("Total net sales | $ 394,328 | $ 365,817", "Vitamin D helps bones.",
                 "As of September 24, 2022, the Company had approximately 164,000 full-time employees.",
                 "the Company repurchased shares during the year and paid dividends to its holders"):
        assert answer.is_statement(text), text


def test_a_line_end_a_pdf_wraps_inside_a_sentence_and_an_abbreviations_period_do_not_end_it():
    text = ("Human Capital\nOur employees are critical to our mission. As of December 31, 2020, we employed approximately\n"
            "1,298,000 full-time and part-time employees. We filed U.S. and international patents.\n"
            "Total net sales | $ 1 | $ 2\nCost of sales | 3 | 4")
    assert [text[s:e] for s, e in answer.sentence_spans(text)] == [
        "Human Capital", "Our employees are critical to our mission.",
        "As of December 31, 2020, we employed approximately\n1,298,000 full-time and part-time employees.",
        "We filed U.S. and international patents.", "Total net sales | $ 1 | $ 2", "Cost of sales | 3 | 4"]


def test_an_answer_leaves_out_sentences_scoring_far_below_its_best_one():
    def sentence(text: str, score: float) -> answer.Sentence:
        p = passage(text)
        return answer.Sentence(p, p.char_start, p.char_end, text, score, coverage=0.8, passage_coverage=0.8)

    best, close, weak = (sentence("Northwind employed 1,298,000 people.", 10.0),
                         sentence("Most of them work full-time.", 6.0), sentence("Our people are our culture.", 4.0))
    assert answer.relevant([best, close, weak]) == [best, close, weak]  # all above the relevance floor
    assert answer.extractive([best, close, weak], max_tokens=512)[0] == [best, close]  # 4 < 0.5 x 10
