"""The generated report PDF of `bench crawl --report-pages`: real pages the extractor reads as a report."""

from __future__ import annotations

import io
import re

from kdbl_worker.bench_samples import report_pdf
from kdbl_worker.extract import Source, extract


def test_the_report_has_its_pages_headings_and_tables_as_rows() -> None:
    data = report_pdf(7)
    assert data == report_pdf(7) and data != report_pdf(7, seed=12)  # deterministic for a seed
    out = extract(Source(io.BytesIO(data), "report.pdf", len(data)))
    assert out.status == "ok"
    pages = sorted({b.page_no for b in out.blocks})
    assert pages == list(range(1, 8))
    text = "\n".join(b.text for b in out.blocks)
    assert all(f"Section {n}:" in text for n in range(1, 8))
    # pages 3 and 6 carry a table: a header of years and 12 rows of a label and five numbers each,
    # every row read as one line of cells (the PDF layout's table rows), not one cell per line
    assert len(re.findall(r"^In millions \| 2024 \| 2023 \| 2022 \| 2021 \| 2020$", text, re.M)) == 2
    rows = re.findall(r"^[A-Z][a-z]+ [a-z]+(?: \| [\d,]+){5}$", text, re.M)
    assert len(rows) == 2 + 24  # the headers ("In millions" is a label too) and the rows
