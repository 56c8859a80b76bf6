"""Regenerate the legacy Office samples in this folder (run once by hand; the tests only read the outputs).

    .venv/bin/python tests/data/legacy/make_samples.py

Needs LibreOffice (Debian: libreoffice-writer-nogui, libreoffice-calc-nogui, libreoffice-impress-nogui,
python3-uno). The text is written as OOXML with python-docx / python-pptx / openpyxl, then LibreOffice
converts it to the binary formats ("MS Word 97", "MS Excel 97", "MS PowerPoint 97"); the
conversion goes through LibreOffice's UNO API (convert_with_uno.py, run by the system python3 that has
the `uno` module), which also stores the password-protected copies. Expected texts: in
tests/unit/test_legacy_office.py.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import tempfile
from pathlib import Path

import docx
import openpyxl
import pptx
from docx.oxml.ns import qn
from docx.oxml.parser import OxmlElement
from pptx.util import Inches, Pt

HERE = Path(__file__).resolve().parent


def _hyperlink(paragraph, url: str, text: str) -> None:
    """A w:hyperlink run: Word 97 stores it as a HYPERLINK field (code + result) the reader must strip."""
    rel = paragraph.part.relate_to(url, docx.opc.constants.RELATIONSHIP_TYPE.HYPERLINK, is_external=True)
    link = OxmlElement("w:hyperlink")
    link.set(qn("r:id"), rel)
    run = OxmlElement("w:r")
    t = OxmlElement("w:t")
    t.text = text
    run.append(t)
    link.append(run)
    paragraph._p.append(link)


def make_docx(path: Path) -> None:
    document = docx.Document()
    document.core_properties.title = "Heron migration report"
    document.add_heading("Heron migration report", level=1)
    document.add_paragraph("The grey heron (Ardea cinerea) winters in the marshes near Lake Kerkini.")
    document.add_paragraph("Café owners in Zürich counted 42 herons; costs were €1,250 in total.")
    document.add_paragraph("Ελληνικά: ερωδιός. Русский: цапля. 日本語: サギ.")  # UTF-16 pieces
    linked = document.add_paragraph("Field notes are at ")
    _hyperlink(linked, "https://example.org/herons", "the survey site")
    linked.add_run(" for everyone.")
    table = document.add_table(rows=2, cols=2)
    for r, row in enumerate([("Site", "Count"), ("Kerkini", "42")]):
        for c, value in enumerate(row):
            table.cell(r, c).text = value
    document.add_paragraph("Closing line with the marker word zanzibarheron.")
    document.save(path)


def make_xlsx(path: Path) -> None:
    book = openpyxl.Workbook()
    book.properties.title = "Tide tables"
    first = book.active
    first.title = "Tides"
    first.append(["Port", "High water", "Height m", "Spring"])
    first.append(["Brest", dt.datetime(2024, 3, 9, 6, 41), 7.25, True])
    first.append(["Saint-Malo", dt.datetime(2024, 3, 9, 7, 2), 12, False])
    first.append([])
    first.append(["Note", "marker word quillonxls"])
    second = book.create_sheet("Ports ÄÖÜ")
    second.append(["Code", "Name"])
    for n in range(1, 61):  # 61 rows: two blocks of at most 50 rows
        second.append([n, f"Port number {n}"])
    book.create_sheet("Empty")
    book.save(path)


def make_pptx(path: Path) -> None:
    presentation = pptx.Presentation()
    presentation.core_properties.title = "Lighthouse keeping"
    slide = presentation.slides.add_slide(presentation.slide_layouts[0])
    slide.shapes.title.text = "Lighthouse keeping"
    slide.placeholders[1].text = "A short course for new keepers"
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Daily duties"
    body = slide.placeholders[1].text_frame
    body.text = "Trim the wick"
    body.add_paragraph().text = "Polish the Fresnel lens"
    box = slide.shapes.add_textbox(Inches(1), Inches(6), Inches(6), Inches(1)).text_frame
    box.text = "Logbook entry: marker word pelorusppt"
    box.paragraphs[0].runs[0].font.size = Pt(14)
    slide.notes_slide.notes_text_frame.text = "Speaker notes: mention the storm of 1703."
    slide = presentation.slides.add_slide(presentation.slide_layouts[5])
    slide.shapes.title.text = "Phare d’Eckmühl — questions?"
    presentation.save(path)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        make_docx(work / "heron.docx")
        make_xlsx(work / "tides.xlsx")
        make_pptx(work / "lighthouse.pptx")
        uno = ["/usr/bin/python3", str(HERE / "convert_with_uno.py"), str(work), str(HERE)]
        subprocess.run(uno, check=True)
    for path in sorted(HERE.iterdir()):
        print(f"{path.name:28} {path.stat().st_size:7} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
