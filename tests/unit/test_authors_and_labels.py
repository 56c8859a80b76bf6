"""Authors from each format's own properties, Markdown front matter tags, and a source's labels
(config `labels` and `label_globs`): the values files.authors and files.labels receive (issue 16).
Every sample is generated here."""

from __future__ import annotations

import io
import zipfile
from email.message import EmailMessage

import pytest
from helpers import make_pdf, pdf_text_page
from kdbl_core.errors import InvalidArgument
from kdbl_core.sources import config as source_config
from kdbl_core.sources.labels import MAX_LABELS, Labeler
from kdbl_worker import sandbox
from kdbl_worker.extract import Extraction, Source, extract


def run_bytes(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


def _zip(members: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as package:
        for name, data in members.items():
            package.writestr(name, data)
    return buffer.getvalue()


def test_a_pdf_names_the_authors_of_its_info_dictionary_split_on_semicolons():
    data = make_pdf([pdf_text_page("Quarterly ducks")], info=b"/Title (Ducks) /Author (Doe, Jane; John  Roe)")
    result = run_bytes(data, "ducks.pdf")
    assert result.status == "ok" and result.title == "Ducks"
    assert result.authors == ["Doe, Jane", "John Roe"]
    assert run_bytes(make_pdf([pdf_text_page("No info")]), "plain.pdf").authors == []


def test_word_powerpoint_and_excel_files_name_their_core_properties_creator():
    import docx
    import openpyxl
    import pptx

    document = docx.Document()
    document.add_paragraph("Ducks swim.")
    document.core_properties.author = "Ada Lovelace"
    buffer = io.BytesIO()
    document.save(buffer)
    assert run_bytes(buffer.getvalue(), "notes.docx").authors == ["Ada Lovelace"]

    deck = pptx.Presentation()
    deck.slides.add_slide(deck.slide_layouts[5]).shapes.title.text = "Ducks"
    deck.core_properties.author = "Grace Hopper; Alan Turing"
    buffer = io.BytesIO()
    deck.save(buffer)
    assert run_bytes(buffer.getvalue(), "deck.pptx").authors == ["Grace Hopper", "Alan Turing"]

    workbook = openpyxl.Workbook()
    workbook.active.append(["duck", 3])
    workbook.properties.creator = "Edsger Dijkstra"
    buffer = io.BytesIO()
    workbook.save(buffer)
    assert run_bytes(buffer.getvalue(), "count.xlsx").authors == ["Edsger Dijkstra"]


def test_an_epub_names_every_dc_creator():
    opf = ('<package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
           '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Duck Tales</dc:title>'
           "<dc:creator>Carl Barks</dc:creator><dc:creator> Don  Rosa </dc:creator></metadata>"
           '<manifest><item id="c1" href="ch1.xhtml" media-type="application/xhtml+xml"/></manifest>'
           '<spine><itemref idref="c1"/></spine></package>')
    container = ('<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container" version="1.0"><rootfiles>'
                 '<rootfile full-path="book.opf" media-type="application/oebps-package+xml"/></rootfiles></container>')
    data = _zip({"mimetype": "application/epub+zip", "META-INF/container.xml": container, "book.opf": opf,
                 "ch1.xhtml": "<html><body><p>Ducks hatch.</p></body></html>"})
    result = run_bytes(data, "tales.epub")
    assert result.status == "ok" and result.authors == ["Carl Barks", "Don Rosa"]


def test_an_email_names_its_senders_display_name_and_address_as_two_authors():
    message = EmailMessage()
    message["From"] = "Jane Doe <jane@example.org>"
    message["To"] = "team@example.org"
    message["Subject"] = "Ducks"
    message.set_content("The ducks arrived.")
    result = run_bytes(message.as_bytes(), "mail.eml")
    assert result.status == "ok" and result.authors == ["Jane Doe", "jane@example.org"]
    bare = EmailMessage()
    bare["From"] = "ops@example.org"
    bare["Subject"] = "x"
    bare.set_content("y")
    assert run_bytes(bare.as_bytes(), "bare.eml").authors == ["ops@example.org"]


def test_an_html_page_names_its_meta_author_and_ignores_other_meta_tags():
    page = ('<html><head><title>Ducks</title><meta name="description" content="not a person">'
            '<meta name="Author" content="Beatrix Potter"></head><body><p>Ducks waddle.</p></body></html>')
    result = run_bytes(page.encode(), "page.html")
    assert result.status == "ok" and result.authors == ["Beatrix Potter"]
    assert run_bytes(b"<html><body><p>x</p></body></html>", "bare.html").authors == []


@pytest.mark.parametrize("front, tags", [
    ('tags: [ducks, "water birds"]', ["ducks", "water birds"]),
    ("tags: ducks, geese", ["ducks", "geese"]),
    ("tags:\n  - ducks\n  - 'geese'\nauthor: x", ["ducks", "geese"]),
    ("title: no tags here", []),
])
def test_markdown_front_matter_tags_become_the_files_own_tags_and_stay_out_of_the_text(front, tags):
    result = run_bytes(f"---\n{front}\n---\n# Pond\nDucks swim.\n".encode(), "pond.md")
    assert result.tags == tags
    assert "tags" not in "\n".join(b.text for b in result.blocks) and result.title == "Pond"


def test_the_sandbox_outcome_carries_cleaned_deduplicated_authors_and_tags():
    data = b"---\ntags: [a, a, b]\n---\ntext\n"
    limits = sandbox.Limits(timeout_s=30)
    outcome = sandbox.extract_and_chunk("x.md", len(data), io.BytesIO(data), limits)
    assert outcome.tags == ["a", "b"] and outcome.authors == []


def test_a_sources_labels_and_label_globs_give_each_key_its_labels_in_order_without_repeats():
    labeler = Labeler.from_config({"labels": ["finance", "2024"],
                                   "label_globs": {"*.pdf": ["pdf", "finance"], "reports/": ["report"]}})
    assert labeler("reports/q1.pdf") == ["finance", "2024", "pdf", "report"]
    assert labeler("notes/a.md", ["draft", "2024"]) == ["finance", "2024", "draft"]
    assert Labeler.from_config({})("a.md", ["x"]) == ["x"]
    assert len(Labeler.from_config({})("a", [f"t{i}" for i in range(200)])) == MAX_LABELS


@pytest.mark.parametrize("config, field", [
    ({"labels": "finance"}, "labels"),
    ({"labels": ["ok", ""]}, "labels"),
    ({"labels": ["x" * 201]}, "labels"),
    ({"label_globs": ["*.pdf"]}, "label_globs"),
    ({"label_globs": {"*.pdf": "pdf"}}, "label_globs"),
    ({"label_globs": {"": ["x"]}}, "label_globs"),
])
def test_a_malformed_labels_config_is_refused_naming_its_field(config, field, tmp_path):
    with pytest.raises(InvalidArgument) as err:
        source_config.parse("fs", {"root": str(tmp_path), **config})
    assert err.value.field == field


def test_a_valid_labels_config_parses_to_its_typed_record(tmp_path):
    parsed = source_config.parse("fs", {"root": str(tmp_path), "labels": [" hr ", "hr"],
                                        "label_globs": {"*.pdf": ["pdf"]}})
    assert parsed.labels == ("hr",) and parsed.label_globs == (("*.pdf", ("pdf",)),)


def test_the_cli_stores_a_sources_labels_and_label_globs_and_refuses_a_glob_without_labels():
    from kdbl_control.cli import build_parser
    from kdbl_control.cli_source import source_config

    def config(*argv: str) -> dict:
        return source_config(build_parser().parse_args(["source", "add", "--tenant", "t", "--protocol", "fs", "--path", "/data",
                                                        *argv]))

    stored = config("--label", "finance", "--label", "2024", "--label-glob", "*.pdf=pdf, scanned",
                    "--label-glob", "reports/=report")
    assert stored["labels"] == ["finance", "2024"]
    assert stored["label_globs"] == {"*.pdf": ["pdf", "scanned"], "reports/": ["report"]}
    assert "labels" not in config() and "label_globs" not in config()
    with pytest.raises(InvalidArgument) as err:
        config("--label-glob", "*.pdf")
    assert err.value.field == "label-glob"
