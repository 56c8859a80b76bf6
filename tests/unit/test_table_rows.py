"""Tables keep their rows: a PDF, DOCX, XLSX or HTML table row is one line, its cells in order and
joined by " | " (issue 28), while prose keeps its lines and reading order.

The PDFs are written by hand (tests/helpers.py: Helvetica text objects placed with Td), each cell its
own text object, in the orders producers use: row by row, column by column, header words line by line.
The one real PDF is docling's 2305.03393v1-pg9.pdf (tests/data/docs, a paper page with a table).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pypdfium2 as pdfium
from helpers import make_pdf
from kdbl_worker.extract import Extraction, Source, extract

DOCS = Path(__file__).resolve().parents[1] / "data" / "docs"


def run_bytes(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


def at(x: float, y: float, text: str, size: int = 10) -> bytes:
    return b"BT /F1 %d Tf %.1f %.1f Td (%s) Tj ET" % (size, x, y, text.encode("latin-1"))


def lines(result: Extraction, page: int = 1) -> list[str]:
    return [line for b in result.blocks if b.page_no == page for line in b.text.split("\n")]


STATEMENT = [("Net sales", "394,328", "365,817"), ("Cost of sales", "223,546", "212,981"),
             ("Gross margin", "170,782", "152,836")]


def _statement(order: str) -> bytes:
    """The statement as text objects, `order` "rows" (label, value, value, next row) or "columns"
    (every label, then each column of values)."""
    cells = [(x, 700 - 14 * i, text) for i, row in enumerate(STATEMENT)
             for x, text in zip((72, 300, 400), row)]
    if order == "columns":
        cells.sort(key=lambda cell: (cell[0], -cell[1]))
    return b"\n".join([at(72, 730, "Income statement (in millions)"), *(at(*cell) for cell in cells)])


def test_pdf_table_written_column_by_column_comes_out_row_by_row():
    result = run_bytes(make_pdf([_statement("columns")]), "statement.pdf")
    assert result.status == "ok", result.reason
    assert lines(result) == ["Income statement (in millions)", "Net sales | 394,328 | 365,817",
                             "Cost of sales | 223,546 | 212,981", "Gross margin | 170,782 | 152,836"]


def test_pdf_table_written_cell_by_cell_joins_its_cells_with_the_separator():
    result = run_bytes(make_pdf([_statement("rows")]), "statement.pdf")
    assert lines(result)[1:] == ["Net sales | 394,328 | 365,817", "Cost of sales | 223,546 | 212,981",
                                 "Gross margin | 170,782 | 152,836"]


def test_pdf_table_rows_stay_on_their_own_pages():
    cover = b"\n".join(at(72, 700 - 14 * i, f"Cover line {i} of the annual report") for i in range(5))
    result = run_bytes(make_pdf([cover, _statement("columns"), cover]), "report.pdf")
    assert [b.page_no for b in result.blocks] == [1, 2, 3]
    assert "Net sales | 394,328 | 365,817" in lines(result, 2)
    assert not any("|" in line for line in lines(result, 1) + lines(result, 3))


def test_pdf_currency_signs_and_percent_stay_with_their_numbers():
    row = [at(72, 700, "Compute revenue"), at(280, 700, "$"), at(320, 700, "47,405"),
           at(360, 700, "$"), at(400, 700, "15,068"), at(470, 700, "215"), at(490, 700, "%")]
    result = run_bytes(make_pdf([b"\n".join(row)]), "segments.pdf")
    assert lines(result) == ["Compute revenue | $ 47,405 | $ 15,068 | 215 %"]


def test_pdf_header_words_printed_line_by_line_become_one_line_of_column_titles():
    header = [(72, 712, "Period"), (220, 724, "Total Number"), (220, 712, "of Shares"),
              (330, 736, "Average"), (330, 724, "Price Paid"), (330, 712, "Per Share")]
    body = [(72, 694, "October 2023"), (230, 694, "5,007,656"), (340, 694, "287.97"),
            (72, 680, "November 2023"), (230, 680, "5,355,638"), (340, 680, "314.26")]
    stream = [at(x, y, text) for x, y, text in sorted(header, key=lambda c: (c[0], -c[1]))]
    result = run_bytes(make_pdf([b"\n".join(stream + [at(*cell) for cell in body])]), "purchases.pdf")
    assert lines(result) == ["Period | Total Number of Shares | Average Price Paid Per Share",
                             "October 2023 | 5,007,656 | 287.97", "November 2023 | 5,355,638 | 314.26"]


LEFT = ["Extraction keeps the reading order of a page", "that sets its text in two columns, the left",
        "column first and then the right one, as the", "producer wrote them into the content stream.",
        "Short last line."]
RIGHT = ["Results", "The right column starts with a heading and", "goes on with a paragraph of its own that the",
         "reader takes after the left column ends, so", "its lines stay apart."]


def test_pdf_two_text_columns_keep_their_reading_order():
    """Each right-column line sits on a left-column line's baseline, short lines and a heading included:
    no row of the page is joined, the text is pdfium's in pdfium's order."""
    stream = [at(72, 700 - 12 * i, text) for i, text in enumerate(LEFT)]
    stream += [at(320, 700 - 12 * i, text) for i, text in enumerate(RIGHT)]
    result = run_bytes(make_pdf([b"\n".join(stream)]), "columns.pdf")
    assert lines(result) == LEFT + RIGHT


def _width(text: str) -> float:
    page = pdfium.PdfDocument(make_pdf([at(72, 700, text)]))[0].get_textpage()
    return page.get_charbox(page.count_chars() - 1, loose=True)[2] - 72


def test_pdf_justified_line_with_wide_word_gaps_stays_one_line_of_text():
    """A paragraph's first line of five words spread evenly to the right margin the next line reaches."""
    full = "fields of a package description list the packages that it needs to run."
    words = ["The", "Depends,", "Imports,", "Suggests", "and"]
    gap = (_width(full) - sum(_width(word) for word in words)) / (len(words) - 1)
    stream, x = [], 72.0
    for word in words:
        stream.append(at(x, 700, word))
        x += _width(word) + gap
    result = run_bytes(make_pdf([b"\n".join([*stream, at(72, 688, full)])]), "justified.pdf")
    assert gap > 2 * 11.7  # two line heights: a cell gap anywhere else
    assert lines(result) == ["The Depends, Imports, Suggests and", full]


def test_pdf_paper_table_rows_keep_their_numbers_and_the_prose_is_unchanged():
    """docling's 2305.03393v1-pg9.pdf: a LaTeX table whose figures are 1.1 line heights apart, between
    paragraphs of prose that must come out as pdfium gives them."""
    data = (DOCS / "2305.03393v1-pg9.pdf").read_bytes()
    result = run_bytes(data, "2305.03393v1-pg9.pdf")
    assert result.status == "ok", result.reason
    page = lines(result)
    assert "6 | 6 | OTSL | 0.965 | 0.934 | 0.955 | 0.88 | 2.73" in page
    assert "4 | 2 | OTSL | 0.952 | 0.92 | 0.942 | 0.857 | 1.22" in page
    raw = re.sub(r"[\x02\ufffe]", "", pdfium.PdfDocument(data)[0].get_textpage().get_text_bounded()).splitlines()
    prose = [line.strip() for line in raw if len(re.findall(r"[A-Za-z]{2,}", line)) >= 8]
    assert len(prose) >= 15
    assert [line for line in page if line in prose] == prose


def test_pdf_page_without_a_table_reads_as_before():
    stream = [at(72, 700 - 12 * i, f"Line {i} of a plain page of prose, nothing else on it.") for i in range(30)]
    data = make_pdf([b"\n".join(stream)])
    before = pdfium.PdfDocument(data)[0].get_textpage().get_text_bounded().replace("\r\n", "\n")
    assert "\n".join(lines(run_bytes(data, "prose.pdf"))) == before


def test_a_long_pdf_of_statement_pages_keeps_every_row_on_every_page():
    """200 statement pages (a 10-K's worth, twice). Its cost is a benchmark's claim, not a test's: ~4 ms a
    page for the layout beside pdfium's own text (docs/benchmarks.md, "Extraction")."""
    data = make_pdf([_statement("columns")] * 200)
    result = run_bytes(data, "long.pdf")
    assert len(result.blocks) == 200 and all("Gross margin | 170,782 | 152,836" in b.text for b in result.blocks)
    assert [b.page_no for b in result.blocks] == list(range(1, 201))


# --- DOCX, XLSX, HTML: one line per row, the same separator -------------------------------------


def _docx(build) -> bytes:
    import docx

    document = docx.Document()
    build(document)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def test_docx_row_repeats_the_label_merged_down_from_the_row_above():
    def build(document):
        rows = [["Region", "Country", "Sales"], ["Europe", "France", "10"], ["", "Germany", "20"],
                ["Asia", "Japan", "30"]]
        table = document.add_table(rows=4, cols=3)
        for r, row in enumerate(rows):
            for c, value in enumerate(row):
                table.cell(r, c).text = value
        table.cell(1, 0).merge(table.cell(2, 0))  # "Europe" spans two rows (w:vMerge)

    result = run_bytes(_docx(build), "sales.docx")
    assert result.blocks[0].text.split("\n") == ["Region | Country | Sales", "Europe | France | 10",
                                                 "Europe | Germany | 20", "Asia | Japan | 30"]


def test_docx_rows_inside_a_repeating_section_content_control_are_kept():
    from docx.oxml.ns import qn

    def build(document):
        table = document.add_table(rows=2, cols=2)
        for r, row in enumerate([["Item", "Amount"], ["Net sales", "394,328"]]):
            for c, value in enumerate(row):
                table.cell(r, c).text = value
        row = table._tbl.tr_lst[1]
        sdt, content = row.makeelement(qn("w:sdt"), {}), row.makeelement(qn("w:sdtContent"), {})
        row.addprevious(sdt)
        sdt.append(content)
        content.append(row)  # the row now sits inside <w:sdt><w:sdtContent>

    result = run_bytes(_docx(build), "sections.docx")
    assert result.blocks[0].text.split("\n") == ["Item | Amount", "Net sales | 394,328"]


def test_xlsx_row_cells_are_joined_by_the_separator_of_every_table():
    import openpyxl

    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Income"
    sheet.append(["Item", "FY2023", "FY2022"])
    sheet.append(["Cost of sales", 223546, 212981])
    out = io.BytesIO()
    book.save(out)
    result = run_bytes(out.getvalue(), "income.xlsx")
    assert result.blocks[0].text.split("\n") == ["Sheet: Income", "Item | FY2023 | FY2022",
                                                 "Cost of sales | 223546 | 212981"]


def test_html_table_row_is_one_line_with_its_cells_in_order():
    page = ("<html><body><h1>Income</h1><table><thead><tr><th>Item</th><th>2023</th><th>2022</th></tr>"
            "</thead><tbody><tr><td>Net sales</td><td>394,328</td><td>365,817</td></tr>"
            "<tr><td><p>Cost of</p><p>sales</p></td><td>223,546</td><td>212,981</td></tr></tbody></table>"
            "<p>Margins rose.</p></body></html>")
    result = run_bytes(page.encode(), "income.html")
    assert [b.text for b in result.blocks] == [
        "Income", "Item | 2023 | 2022\nNet sales | 394,328 | 365,817\nCost of sales | 223,546 | 212,981",
        "Margins rose."]


def test_html_label_spanning_rows_is_repeated_on_every_row_it_spans():
    page = ("<table><tr><th>Year</th><th>Quarter</th><th>Revenue</th></tr>"
            "<tr><td rowspan=3>2025</td><td rowspan=2>Q1</td><td>$134</td></tr><tr><td>$150</td></tr>"
            "<tr><td>Q2</td><td>$210</td></tr></table>")
    result = run_bytes(page.encode(), "pivot.html")
    assert result.blocks[0].text.split("\n") == ["Year | Quarter | Revenue", "2025 | Q1 | $134",
                                                 "2025 | Q1 | $150", "2025 | Q2 | $210"]


def test_html_layout_table_keeps_its_paragraphs_as_blocks():
    """A mail or an old site laid out in a table: its cells hold headings and paragraphs, not values."""
    page = ("<table><tr><td><h1>Newsletter</h1><p>First news of the month.</p><p>Second news.</p>"
            "<p>Third news.</p></td><td>Sidebar links</td></tr></table>")
    result = run_bytes(page.encode(), "mail.html")
    assert [b.text for b in result.blocks] == ["Newsletter", "First news of the month.", "Second news.",
                                               "Third news.", "Sidebar links"]
