"""A hit's text: the matched chunk first, then as much of its neighbours as fits the ~1,800-char budget."""

from __future__ import annotations

import itertools

from kdbl_core.search.windows import HIT_TEXT_BUDGET, _assemble


def _chunk(n: int, c: str) -> str:
    return c * n


def test_a_hit_with_only_a_previous_neighbour_stays_within_the_budget() -> None:
    text, truncated = _assemble(_chunk(1200, "h"), _chunk(1200, "p"), None, HIT_TEXT_BUDGET)
    assert len(text) == HIT_TEXT_BUDGET and truncated  # was 1,801
    assert text.endswith("h" * 1200) and text.startswith("…p")


def test_no_combination_of_sizes_exceeds_the_budget_and_truncated_says_when_text_was_left_out() -> None:
    sizes = [0, 1, 2, 5, 899, 900, 1799, 1800, 1801, 4000]
    for hit, prev, nxt, budget in itertools.product(sizes, [None, *sizes], [None, *sizes], [HIT_TEXT_BUDGET, 3, 10]):
        text, truncated = _assemble(_chunk(hit, "h"), _chunk(prev, "p") if prev is not None else None,
                                    _chunk(nxt, "n") if nxt is not None else None, budget)
        whole = hit + (prev + 1 if prev is not None else 0) + (nxt + 1 if nxt is not None else 0)
        assert len(text) <= budget, (hit, prev, nxt, budget)
        assert truncated == (whole > budget), (hit, prev, nxt, budget)
        assert "h" * min(hit, budget) in text


def test_unused_room_of_a_short_neighbour_goes_to_the_other() -> None:
    text, truncated = _assemble(_chunk(800, "h"), _chunk(100, "p"), _chunk(2000, "n"), HIT_TEXT_BUDGET)
    assert text.startswith("p" * 100 + "\n" + "h" * 800 + "\n") and len(text) == HIT_TEXT_BUDGET and truncated
