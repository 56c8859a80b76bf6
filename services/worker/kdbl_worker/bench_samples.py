"""Generated documents for `bench_crawl`: a long report-like PDF (text pages, headings, tables).

`report_pdf(pages)` writes a PDF 1.4 by hand (PDF 32000-1 7.5: one content stream per page, the base-14
Helvetica font, no external resources): each page a numbered section heading, ~30 lines of prose of
made-up words, and on every third page a table of 12 rows and 5 numeric columns placed at fixed x
positions, as a financial report lays out its statements. Deterministic for a seed, so two runs index
the same bytes. 300 pages are ~1.5 MB and ~135,000 words.
"""

from __future__ import annotations

import random
from pathlib import Path

_LINES = 30
_TABLE_EVERY = 3
_TABLE_ROWS = 12
_COLUMNS = (300, 360, 420, 480, 540)


def _escape(text: str) -> bytes:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


def _page(rnd: random.Random, words: list[str], number: int) -> bytes:
    out = [b"BT /F1 14 Tf 72 750 Td (%s) Tj ET" % _escape(f"Section {number}: {' '.join(rnd.sample(words, 3))}")]
    y = 725
    table = number % _TABLE_EVERY == 0
    lines = _LINES - (_TABLE_ROWS + 2 if table else 0)
    for _ in range(lines):
        line = " ".join(rnd.choice(words) for _ in range(rnd.randint(9, 13))).capitalize() + "."
        out.append(b"BT /F1 10 Tf 72 %d Td (%s) Tj ET" % (y, _escape(line)))
        y -= 14
    if table:
        y -= 10
        header = ["2024", "2023", "2022", "2021", "2020"]
        out.append(b"BT /F1 10 Tf 72 %d Td (%s) Tj ET" % (y, _escape("In millions")))
        out += [b"BT /F1 10 Tf %d %d Td (%s) Tj ET" % (x, y, _escape(h)) for x, h in zip(_COLUMNS, header, strict=True)]
        for _ in range(_TABLE_ROWS):
            y -= 14
            label = " ".join(rnd.sample(words, 2)).capitalize()
            out.append(b"BT /F1 10 Tf 72 %d Td (%s) Tj ET" % (y, _escape(label)))
            out += [b"BT /F1 10 Tf %d %d Td (%s) Tj ET" % (x, y, _escape(f"{rnd.randint(100, 99_999):,}"))
                    for x in _COLUMNS]
    out.append(b"BT /F1 8 Tf 300 40 Td (%d) Tj ET" % number)
    return b"\n".join(out)


def report_pdf(pages: int, seed: int = 11) -> bytes:
    """A `pages`-page report as PDF bytes (module docstring)."""
    rnd = random.Random(seed)
    words = ["".join(rnd.choice("abcdefghiklmnoprstuvy") for _ in range(rnd.randint(3, 10))) for _ in range(8_000)]
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"",
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>"]
    kids = []
    for number in range(1, pages + 1):
        content = _page(rnd, words, number)
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content))
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
                       b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % len(objects))
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    return pdf_file(objects)


def pdf_file(objects: list[bytes], trailer_extra: bytes = b"") -> bytes:
    """Numbered objects (1 = the catalog) serialised as a PDF 1.4 file with its xref table and trailer
    (the tests' hand-written PDFs use it too)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R%s >>\n" % (len(objects) + 1, trailer_extra)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def write_report_pdf(path: Path, pages: int, seed: int = 11) -> Path:
    """`report_pdf` written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(report_pdf(pages, seed))
    return path
