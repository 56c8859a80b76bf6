"""HTML as it is found on shares keeps its text (issue 28): read the way a browser would, a head left
open ends where the body's content starts, a title left open at the next tag, and a page whose text
all sits in boilerplate keeps it rather than coming out empty."""

from __future__ import annotations

import io
import time

from kdbl_worker.extract import Extraction, Source, extract


def run_html(page: str, name: str = "page.html") -> Extraction:
    data = page.encode()
    return extract(Source(io.BytesIO(data), name, len(data)))


def test_html_without_closing_head_keeps_its_text():
    result = run_html("<html><head><title>Minutes</title><meta charset=utf-8>\n"
                      "<body><h1>Board minutes</h1><p>The board approved the budget.</p></body></html>")
    assert (result.status, result.title) == ("ok", "Minutes")
    assert [b.text for b in result.blocks] == ["Board minutes", "The board approved the budget."]


def test_html_without_closing_head_or_body_tag_keeps_its_text():
    result = run_html("<html><head><title>Minutes</title>\n<p>The board approved the budget.")
    assert [b.text for b in result.blocks] == ["The board approved the budget."]


def test_html_text_written_straight_into_the_head_is_kept():
    result = run_html("<html><head><title>Notes</title>Loose first line<p>Second line</p></html>")
    assert [b.text for b in result.blocks] == ["Loose first line", "Second line"]


def test_html_with_an_unclosed_title_keeps_the_body_out_of_the_title():
    result = run_html("<html><head><title>Minutes\n<body><p>The board approved the budget.</p></body></html>")
    assert (result.title, [b.text for b in result.blocks]) == ("Minutes", ["The board approved the budget."])


def test_html_whose_text_all_sits_in_an_unclosed_header_keeps_it():
    result = run_html("<html><body><header><h1>Board minutes</h1><p>The board approved the budget.")
    assert result.status == "ok"
    assert [b.text for b in result.blocks] == ["Board minutes", "The board approved the budget."]


def test_html_boilerplate_is_still_dropped_when_the_page_has_other_text():
    result = run_html("<nav>Home | Contact</nav><p>The board approved the budget.</p><footer>(c) 2024</footer>")
    assert [b.text for b in result.blocks] == ["The board approved the budget."]


def test_html_unclosed_comment_at_the_end_is_not_text():
    result = run_html("<p>The board approved the budget.</p><!-- editor notes, never closed")
    assert [b.text for b in result.blocks] == ["The board approved the budget."]


def test_html_unclosed_cells_and_rows_still_make_one_line_per_row():
    result = run_html("<table><tr><td>Net sales<td>394,328<tr><td>Cost of sales<td>223,546</table><p>After")
    assert [b.text for b in result.blocks] == ["Net sales | 394,328\nCost of sales | 223,546", "After"]


def test_html_table_of_20000_rows_extracts_in_linear_time():
    """One block holds the whole table: its parts are joined once at the end, not copied at every cell."""
    rows = "".join(f"<tr><td>Item {i}</td><td>{i * 37 % 1000}.{i % 100:02d}</td></tr>" for i in range(20_000))
    start = time.perf_counter()
    result = run_html(f"<main><table>{rows}</table></main>")
    elapsed = time.perf_counter() - start
    lines = result.blocks[0].text.split("\n")
    assert len(lines) == 20_000 and lines[-1] == "Item 19999 | 963.99"
    assert elapsed < 10, elapsed  # ~0.6 s here
