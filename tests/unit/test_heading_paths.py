"""Heading paths from extraction to chunks: the heading stack, each format's headings (Markdown ATX and
setext outside fenced code, HTML h1-h6, DOCX heading styles and outline levels, ODT text:h, EPUB, the PDF
outline), the chunk's context_header (its first block's path, bounded), and the path across the sandbox's
process boundary. Chunk boundaries do not move for it. All documents are generated (heading_samples)."""

from __future__ import annotations

import io
import zipfile

import docx as python_docx
import heading_samples as samples
import pytest
from docx.enum.style import WD_STYLE_TYPE
from docx.oxml import OxmlElement
from docx.oxml.ns import qn

from kdbl_worker import sandbox
from kdbl_worker.chunking import HEADER_CHARS, chunk_blocks, context_header
from kdbl_worker.extract import Extraction, Source, extract
from kdbl_worker.extract.base import Block
from kdbl_worker.extract.headings import HeadingPath

MANUAL = ("Solar plant manual",)
HELIOSTATS = MANUAL + ("Heliostats",)
CLEANING = HELIOSTATS + ("Cleaning",)
RECEIVER = MANUAL + ("Receiver",)


def run_bytes(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


def path_of(result: Extraction, word: str) -> tuple[str, ...]:
    [block] = [b for b in result.blocks if word in b.text]
    return block.heading


def test_a_heading_closes_the_open_headings_at_its_level_and_deeper():
    path = HeadingPath()
    assert path.enter(1, "Guide") == ("Guide",)
    assert path.enter(3, "  Deep   heading ") == ("Guide", "Deep heading")  # levels may skip
    assert path.enter(2, "Install") == ("Guide", "Install")
    assert path.enter(3, "Offline") == ("Guide", "Install", "Offline")
    assert path.enter(2, "Upgrade") == ("Guide", "Upgrade")
    assert path.enter(2, "") == ("Guide",)  # an empty heading only closes
    assert path.enter(1, "Reference") == ("Reference",)


@pytest.mark.parametrize("text", [samples.markdown(), samples.markdown_setext()], ids=["atx", "setext"])
def test_markdown_blocks_carry_the_heading_path_of_atx_and_setext_headings(text):
    result = run_bytes(text.encode(), "manual.md")
    assert result.status == "ok"
    assert path_of(result, "azimuth") == HELIOSTATS
    assert path_of(result, "brushes") == CLEANING
    assert path_of(result, "moltensalt") == RECEIVER


def test_a_hash_line_inside_fenced_code_is_not_a_markdown_heading():
    text = "# Guide\n\n~~~~\n# shell comment\n\n## also code\n~~~~\n\nafter the code\n\n```\n# x\n```\n\nend"
    result = run_bytes(text.encode(), "fenced.md")
    assert {b.heading for b in result.blocks} == {("Guide",)}
    assert path_of(result, "after the code") == ("Guide",)


def test_html_headings_make_the_path_and_those_in_a_skipped_header_do_not_count():
    result = run_bytes(samples.html().encode(), "manual.html")
    assert path_of(result, "azimuth") == HELIOSTATS
    assert path_of(result, "brushes") == CLEANING
    assert path_of(result, "moltensalt") == RECEIVER
    assert result.blocks[0].text == "Solar plant manual" and result.blocks[0].heading == MANUAL


def test_docx_headings_come_from_heading_styles():
    result = run_bytes(samples.docx(), "manual.docx")
    assert path_of(result, "azimuth") == HELIOSTATS
    assert path_of(result, "brushes") == CLEANING
    assert path_of(result, "moltensalt") == RECEIVER


def test_docx_headings_come_from_outline_levels_based_on_chains_and_the_title_style():
    document = python_docx.Document()
    document.add_paragraph("Annual report", style="Title")
    chapter = document.styles.add_style("Kapitel", WD_STYLE_TYPE.PARAGRAPH)  # a custom style id and name
    outline = OxmlElement("w:outlineLvl")
    outline.set(qn("w:val"), "0")
    chapter.element.get_or_add_pPr().append(outline)
    section = document.styles.add_style("Abschnitt", WD_STYLE_TYPE.PARAGRAPH)
    section.base_style = document.styles["Heading 2"]  # a heading by its base style
    document.add_paragraph("Finances", style="Kapitel")
    document.add_paragraph("Costs", style="Abschnitt")
    document.add_paragraph("Fuel costs rose.")
    direct = document.add_paragraph("Staff")  # a Normal paragraph with its own outline level 1 (0-based 0)
    own = OxmlElement("w:outlineLvl")
    own.set(qn("w:val"), "0")
    direct._p.get_or_add_pPr().append(own)
    document.add_paragraph("Twelve people work here.")
    table = document.add_table(rows=1, cols=1)
    table.cell(0, 0).add_paragraph("Cell heading", style="Heading 1")  # never a heading: inside a table
    document.add_paragraph("After the table.")
    out = io.BytesIO()
    document.save(out)
    result = run_bytes(out.getvalue(), "report.docx")
    assert path_of(result, "Fuel") == ("Annual report", "Finances", "Costs")
    assert path_of(result, "Twelve") == ("Annual report", "Staff")
    assert path_of(result, "After the table") == ("Annual report", "Staff")


def test_odt_text_h_outline_levels_make_the_path():
    ns = ('xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
          'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
          'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"')
    content = (f"<office:document-content {ns}><office:body><office:text>"
               '<text:h text:outline-level="1">Manual</text:h><text:h text:outline-level="2">Pumps</text:h>'
               "<text:p>Pumps move water.</text:p><text:h>Valves</text:h><text:p>Valves stop it.</text:p>"
               "</office:text></office:body></office:document-content>")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as package:
        package.writestr("mimetype", "application/vnd.oasis.opendocument.text")
        package.writestr("content.xml", content)
    result = run_bytes(buffer.getvalue(), "manual.odt")
    assert path_of(result, "Pumps move") == ("Manual", "Pumps")
    assert path_of(result, "Valves stop") == ("Valves",)  # text:h without a level is level 1


def test_epub_blocks_carry_their_chapters_headings():
    opf = ('<package xmlns="http://www.idpf.org/2007/opf" version="3.0"><metadata/>'
           '<manifest><item id="c1" href="c1.xhtml" media-type="application/xhtml+xml"/>'
           '<item id="c2" href="c2.xhtml" media-type="application/xhtml+xml"/></manifest>'
           '<spine><itemref idref="c1"/><itemref idref="c2"/></spine></package>')
    container = ('<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container" version="1.0"><rootfiles>'
                 '<rootfile full-path="book.opf"/></rootfiles></container>')
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as package:
        package.writestr("mimetype", "application/epub+zip")
        package.writestr("META-INF/container.xml", container)
        package.writestr("book.opf", opf)
        package.writestr("c1.xhtml", "<html><body><h1>One</h1><h2>Eggs</h2><p>Ducks hatch.</p></body></html>")
        package.writestr("c2.xhtml", "<html><body><h1>Two</h1><p>Ducks fly.</p></body></html>")
    result = run_bytes(buffer.getvalue(), "tales.epub")
    assert path_of(result, "hatch") == ("One", "Eggs")
    assert path_of(result, "fly") == ("Two",)


def test_pdf_pages_take_the_path_of_the_last_outline_entry_at_or_before_them():
    result = run_bytes(samples.manual_pdf(), "manual.pdf")
    assert result.status == "ok"
    assert [(b.page_no, b.heading) for b in result.blocks] == [
        (1, MANUAL), (2, HELIOSTATS), (3, CLEANING),  # Cleaning points at its page by a GoTo action
        (4, CLEANING),  # no entry of its own: the last one before it
        (5, RECEIVER)]


def test_pdf_pages_before_the_first_outline_entry_and_pdfs_without_one_have_no_path():
    late = samples.pdf_with_outline(["cover", "body"], [(1, "Body", 1)])
    assert [b.heading for b in run_bytes(late, "late.pdf").blocks] == [(), ("Body",)]
    bare = samples.pdf_with_outline(["only page"], [])
    assert [b.heading for b in run_bytes(bare, "bare.pdf").blocks] == [()]


def test_a_chunk_takes_the_heading_path_of_its_first_block():
    blocks = [Block("intro " * 150, heading=("Guide",)), Block("install " * 150, heading=("Guide", "Install")),
              Block("plain text without headings " * 40)]
    _, chunks = chunk_blocks(blocks, target=1000, max_chars=1200)
    assert [c.context_header for c in chunks] == ["Guide", "Guide > Install", None]


def test_a_chunk_that_opens_with_headings_is_named_by_the_text_they_introduce():
    blocks = [Block("# Guide", heading=("Guide",)), Block("## Install", heading=("Guide", "Install")),
              Block("Run the installer. " * 20, heading=("Guide", "Install"))]
    _, chunks = chunk_blocks(blocks)
    assert len(chunks) == 1 and chunks[0].context_header == "Guide > Install"


def test_a_long_block_cut_in_pieces_gives_every_piece_its_path():
    _, chunks = chunk_blocks([Block("A sentence of text. " * 300, heading=("Long", "Part"))],
                             target=400, max_chars=500)
    assert len(chunks) > 5 and {c.context_header for c in chunks} == {"Long > Part"}


def test_headings_do_not_move_chunk_boundaries():
    texts = ["# Guide", "intro " * 60, "## Install", "step " * 300, "## Use", "use " * 20] * 3
    plain = [Block(t) for t in texts]
    headed = samples_paths = []
    path: tuple[str, ...] = ()
    for t in texts:
        if t.startswith("# "):
            path = (t[2:],)
        elif t.startswith("## "):
            path = path[:1] + (t[3:],)
        samples_paths.append(Block(t, heading=path))
    assert [(c.char_start, c.char_end) for c in chunk_blocks(plain)[1]] == \
        [(c.char_start, c.char_end) for c in chunk_blocks(headed)[1]]


def test_the_context_header_is_folded_and_bounded_keeping_the_outermost_and_nearest_headings():
    assert context_header(()) is None
    assert context_header((" Guide \n", "  Install   now ")) == "Guide > Install now"
    deep = tuple(f"Level {n} " + "x" * 150 for n in range(10))
    header = context_header(deep)
    assert len(header) <= HEADER_CHARS
    parts = header.split(" > ")
    assert parts[0].startswith("Level 0") and parts[1] == "…" and parts[-1].startswith("Level 9")
    assert all(len(p) <= 160 for p in parts)


def test_the_context_header_survives_the_sandbox_child():
    data = samples.markdown().encode()
    box = sandbox.Sandbox(processes=1, limits=sandbox.Limits())
    try:
        [(_, outcome)] = list(box.run([sandbox.Task("md", "manual.md", len(data), data=data)]))
    finally:
        box.close()
    assert outcome.status == "ok"
    assert [c[7] for c in outcome.chunks] == ["Solar plant manual > Heliostats",
                                              "Solar plant manual > Heliostats > Cleaning",
                                              "Solar plant manual > Receiver"]
