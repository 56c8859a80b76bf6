"""Text extraction for PDF, Office, e-mail, data, subtitle and e-book formats.

Real Office, CSV and subtitle files ship in tests/data/docs (docling test data, MIT, ~300 KB); PDFs
(text, encrypted, image-only) and workbooks are generated here, as are the formats docling lacks
(EML, MSG, JSON, XML, SRT, ODT, EPUB, RTF), to their specs. Nothing comes from outside the
repository. Each test states behaviour: locators, statuses and reasons, no exceptions.
"""

from __future__ import annotations

import io
import json
import re
import struct
import time
import tracemalloc
import zipfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import EmailMessage
from pathlib import Path

import pytest
from helpers import make_pdf, pdf_text_page
from kdbl_worker.extract import Extraction, Source, extract, supported_extensions
from kdbl_worker.extract.pdf import extract_pdf
from kdbl_worker.extract.xlsx import extract_xlsx

DOCS = Path(__file__).resolve().parents[1] / "data" / "docs"
MULTI_PAGE = [
    "The Evolution of the Word Processor. Typewriters gave way to dedicated machines.",
    "Early software. Electric Pencil and WordStar ran on microcomputers.",
    "Specialized Word Processing Tools. Legal and academic writers needed footnotes.",
    "The graphical era. WYSIWYG editors showed the printed page on screen.",
    "Today. Collaborative editors run in the browser.",
]


def _workbook(path: Path, *, inflated: bool = False) -> Path:
    """Four sheets (Sheet1: first/second/third, then 1 5 9, 2 6 10, ...); `inflated` rewrites the first
    sheet's <dimension> to claim the whole grid (A1:XFD1048576), as some exporters do."""
    import openpyxl
    book = openpyxl.Workbook()
    first = book.active
    first.title = "Sheet1"
    first.append(["first", "second", "third"])
    for n in range(1, 5):
        first.append([n, n + 4, n + 8])
    for name, rows in (("Sheet2", 8), ("Sheet3", 3), ("Sheet4", 2)):
        sheet = book.create_sheet(name)
        for n in range(rows):
            sheet.append([f"{name} row {n}", n, n * n])
    book.save(path)
    if inflated:
        with zipfile.ZipFile(path) as package:
            parts = {name: package.read(name) for name in package.namelist()}
        sheet = parts["xl/worksheets/sheet1.xml"].decode()
        sheet = re.sub(r'<dimension ref="[^"]+"', '<dimension ref="A1:XFD1048576"', sheet)
        parts["xl/worksheets/sheet1.xml"] = sheet.encode()
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as package:
            for name, data in parts.items():
                package.writestr(name, data)
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The generated documents: multi_page.pdf (5 text pages), encrypted.pdf, image_only.pdf (a drawn
    page, no text), xlsx_01.xlsx and xlsx_04_inflated.xlsx, beside links to the shipped files."""
    root = tmp_path_factory.mktemp("docs")
    (root / "multi_page.pdf").write_bytes(make_pdf([pdf_text_page(t) for t in MULTI_PAGE]))
    (root / "encrypted.pdf").write_bytes(make_pdf([pdf_text_page("secret minutes")], encrypt=True))
    drawn = [b"0.5 g 72 72 468 648 re f", b"0 0 1 rg 100 100 200 200 re f"]
    (root / "image_only.pdf").write_bytes(make_pdf(drawn))
    _workbook(root / "xlsx_01.xlsx")
    _workbook(root / "xlsx_04_inflated.xlsx", inflated=True)
    for shipped in DOCS.iterdir():
        if shipped.suffix not in (".md", "") and shipped.name != "LICENSE":
            (root / shipped.name).symlink_to(shipped)
    return root


def run_file(path: Path, name: str | None = None) -> Extraction:
    with path.open("rb") as stream:
        return extract(Source(stream, name or path.name, path.stat().st_size))


def run_bytes(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


@dataclass
class Peak:
    bytes: int = 0


@contextmanager
def peak_memory() -> Iterator[Peak]:
    """The most memory Python allocated inside the block: a bound that does not depend on the machine's load."""
    peak = Peak()
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.bytes = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def texts(result: Extraction) -> str:
    return "\n".join(block.text for block in result.blocks)


# --- PDF ---------------------------------------------------------------------------------


def test_pdf_one_block_per_page_with_page_numbers(data):
    result = run_file(data / "multi_page.pdf")
    assert result.status == "ok", result.reason
    assert result.content_type == "application/pdf"
    assert [b.page_no for b in result.blocks] == [1, 2, 3, 4, 5]
    assert result.blocks[0].text.startswith("The Evolution of the Word Processor")
    assert "Specialized Word Processing Tools" in result.blocks[2].text


def test_pdf_page_cap_gives_partial(data):
    path = data / "multi_page.pdf"
    with path.open("rb") as stream:
        result = extract_pdf(Source(stream, path.name, path.stat().st_size), max_pages=2)
    assert result.status == "partial"
    assert "page cap" in result.reason and "2 of 5" in result.reason
    assert [b.page_no for b in result.blocks] == [1, 2]


def test_pdf_with_a_thousand_pages_is_streamed_and_capped(tmp_path, data):
    import pypdfium2 as pdfium

    source_doc = pdfium.PdfDocument(data / "multi_page.pdf")  # 5 pages
    big = pdfium.PdfDocument.new()
    for _ in range(202):
        big.import_pages(source_doc)
    path = tmp_path / "big.pdf"
    big.save(path)
    big.close()
    source_doc.close()
    start = time.perf_counter()
    with path.open("rb") as stream:  # crosses the reopen-every-500-pages boundary twice
        result = extract_pdf(Source(stream, path.name, path.stat().st_size), max_pages=1005)
    print(f"\n1005 PDF pages in {time.perf_counter() - start:.1f}s")
    assert result.status == "partial" and "extracted 1005 of 1010 pages" in result.reason
    assert [b.page_no for b in result.blocks] == list(range(1, 1006))
    assert result.blocks[504].text == result.blocks[4].text  # same source page, after a reopen


def test_pdf_password_protected_fails_as_encrypted(data):
    result = run_file(data / "encrypted.pdf")
    assert result.status == "failed"
    assert "encrypted" in result.reason


def test_pdf_without_text_layer_is_skipped_not_ocrd(data):
    result = run_file(data / "image_only.pdf")
    assert result.status == "skipped"
    assert result.reason == "no text layer (scanned?)"
    assert result.blocks == []


def test_truncated_files_get_a_status_without_raising(data):
    for rel in ("multi_page.pdf", "lorem_ipsum.docx", "powerpoint_sample.pptx", "xlsx_01.xlsx"):
        whole = (data / rel).read_bytes()
        result = run_bytes(whole[: len(whole) // 2], rel)
        assert result.status in {"failed", "partial", "ok", "skipped"}
        if not rel.endswith(".pdf"):  # zip packages lose their central directory
            assert result.status == "failed" and "zip" in result.reason


@pytest.mark.parametrize(
    "name",
    [
        "junk.pdf",
        "junk.docx",
        "junk.pptx",
        "junk.xlsx",
        "junk.odt",
        "junk.epub",
        "junk.msg",
        "junk.rtf",
        "junk.eml",
        "junk.json",
        "junk.xml",
    ],
)
def test_binary_junk_fails_cleanly(name):
    junk = bytes(range(256)) * 64 + b"\x00\xff" * 1000
    result = run_bytes(junk, name)
    assert result.status == "failed", result
    assert result.reason and result.blocks == []


# --- Office ------------------------------------------------------------------------------


def test_docx_paragraphs_and_tables_in_body_order(data):
    result = run_file(data / "word_tables.docx")
    assert result.status == "ok"
    body = [b.text for b in result.blocks]
    assert body[0] == "Test with tables"
    table = next(i for i, t in enumerate(body) if t.startswith("Header 0.0 | Header 0.1 | Header 0.2"))
    assert body[table - 1] == "A uniform table"
    assert "Cell 2.0 | Cell 2.1 | Cell 2.2" in body[table]


def test_docx_keeps_text_boxes_content_controls_equations_and_strict_files(data):
    assert "Text 2" in texts(run_file(data / "drawingml.docx"))
    assert "COVER TITLE INSIDE SDT" in texts(
        run_file(data / "content_control_with_picture.docx")
    )
    assert "A=πr2" in texts(run_file(data / "equations.docx"))
    strict = run_file(data / "Strict.docx")
    assert (strict.status, texts(strict)) == ("ok", "Some text")


def test_pptx_one_block_per_slide_with_notes(data):
    result = run_file(data / "powerpoint_sample.pptx")
    assert result.status == "ok"
    assert [b.page_no for b in result.blocks] == [1, 2, 3]
    assert result.blocks[0].text.startswith("Test Table Slide")
    assert "Notes: Some notes on the second slide." in result.blocks[1].text
    assert "R1 | True | False" in result.blocks[0].text  # table rows


def test_pptx_unrecognized_shape_text_is_kept(data):
    result = run_file(data / "powerpoint_unrecognized_shape.pptx")
    assert result.status == "ok"
    assert "Text in an unrecognized shape" in result.blocks[1].text


def test_xlsx_sheets_as_blocks_of_rows_with_cells_joined_by_the_table_separator(data):
    result = run_file(data / "xlsx_01.xlsx")
    assert result.status == "ok"
    assert [b.page_no for b in result.blocks] == [1, 2, 3, 4]
    first = result.blocks[0].text.split("\n")
    assert first[:3] == ["Sheet: Sheet1", "first | second | third", "1 | 5 | 9"]


def test_xlsx_inflated_dimensions_do_not_blow_up(data):
    with peak_memory() as peak:
        inflated = run_file(data / "xlsx_04_inflated.xlsx")  # claims ~1M rows
    assert peak.bytes < 64 * 2**20  # a million allocated rows would be gigabytes
    normal = run_file(data / "xlsx_01.xlsx")
    assert inflated.status == "ok"
    assert inflated.blocks[0].text == normal.blocks[0].text


def test_xlsx_cell_cap_gives_partial(data):
    path = data / "xlsx_01.xlsx"
    with path.open("rb") as stream:
        result = extract_xlsx(Source(stream, path.name, path.stat().st_size), max_cells=30)
    assert result.status == "partial" and "cell cap" in result.reason
    assert {b.page_no for b in result.blocks} <= {1, 2}


def test_xlsx_rows_grouped_in_blocks_of_fifty(tmp_path):
    import openpyxl
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.title = "Ducks"
    for n in range(120):
        sheet.append([f"duck {n}", n])
    book.create_sheet("Empty")
    path = tmp_path / "ducks.xlsx"
    book.save(path)
    result = run_file(path)
    assert [b.page_no for b in result.blocks] == [1, 1, 1]
    assert [b.text.count("\n") for b in result.blocks] == [50, 50, 20]
    assert all(b.text.startswith("Sheet: Ducks\n") for b in result.blocks)
    assert result.blocks[2].text.endswith("duck 119 | 119")


# --- CSV ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["csv-comma.csv", "csv-semicolon.csv", "csv-tab.csv", "csv-pipe.csv"])
def test_csv_delimiters_are_sniffed(name, data):
    result = run_file(data / name)
    assert result.status == "ok"
    lines = result.blocks[0].text.split("\n")
    assert lines[0].startswith("Index\tCustomer Id\tFirst Name")
    assert lines[1].startswith("1\tDD37Cf93aecA6Dc\tSheryl\tBaxter")


def test_csv_header_repeated_on_every_block(tmp_path):
    rows = ["name,count"] + [f'"duck, {n}",{n}' for n in range(120)]
    result = run_bytes("\n".join(rows).encode(), "ducks.csv")
    assert result.status == "ok"
    assert len(result.blocks) == 3
    assert all(b.text.startswith("name\tcount\n") for b in result.blocks)
    assert result.blocks[0].text.split("\n")[1] == "duck, 0\t0"


# --- subtitles ---------------------------------------------------------------------------


def test_vtt_cues_with_timestamps_and_no_tags(data):
    result = run_file(data / "webvtt_example_01.vtt")
    assert result.status == "ok"
    first = result.blocks[0]
    assert (first.ts_start_ms, first.ts_end_ms) == (11_000, 13_000)
    assert first.text == "Roger Bingham: We are in New York City"
    assert not any("<" in b.text for b in result.blocks)
    hours = run_file(data / "webvtt_example_04.vtt")
    assert hours.blocks[0].ts_start_ms == 4 * 3_600_000 + 3 * 60_000
    assert "steaming bowl of paella" in hours.blocks[1].text and hours.blocks[1].ts_end_ms == 14_818_239


def test_srt_cues(tmp_path):
    srt = (
        "1\r\n00:00:01,500 --> 00:00:04,000\r\n<i>Hello</i> there,\r\n{\\an8}general.\r\n\r\n"
        "2\r\n00:01:02,003 --> 00:01:05,250\r\nSecond &amp; last cue\r\n\r\n"
        "3\r\nthis is not a timing line --> really\r\nlost\r\n"
    )
    result = run_bytes(srt.encode(), "movie.srt")
    assert result.content_type == "application/x-subrip"
    assert [(b.text, b.ts_start_ms, b.ts_end_ms) for b in result.blocks] == [
        ("Hello there, general.", 1_500, 4_000),
        ("Second & last cue", 62_003, 65_250),
    ]
    assert result.status == "partial" and "timing" in result.reason


# --- e-mail ------------------------------------------------------------------------------


def _email(html_only: bool = False) -> bytes:
    message = EmailMessage()
    message["From"] = "Alice Example <alice@example.org>"
    message["To"] = "Bob <bob@example.org>"
    message["Cc"] = "=?utf-8?q?Zo=C3=AB?= <zoe@example.org>"
    message["Date"] = "Mon, 06 May 2024 07:08:09 +0000"
    message["Subject"] = "Quarterly duck census"
    if html_only:
        message.set_content(
            "<html><body><p>The census found <b>42</b> ducks.</p><script>x()</script></body></html>",
            subtype="html",
        )
    else:
        message.set_content("Hello Bob,\n\nThe census found 42 ducks.\n")
        message.add_attachment(b"a,b\n1,2\n", maintype="text", subtype="csv", filename="ducks.csv")
        message.add_attachment(b"%PDF-1.4 fake", maintype="application", subtype="pdf", filename="report.pdf")
    return message.as_bytes()


def test_eml_headers_body_and_attachment_list():
    result = run_bytes(_email(), "census.eml")
    assert result.status == "ok"
    assert result.content_type == "message/rfc822"
    assert result.title == "Quarterly duck census"
    assert result.blocks[0].text.split("\n") == [
        "From: Alice Example <alice@example.org>",
        "To: Bob <bob@example.org>",
        "Cc: Zoë <zoe@example.org>",
        "Date: Mon, 06 May 2024 07:08:09 +0000",
        "Subject: Quarterly duck census",
    ]
    assert [b.text for b in result.blocks[1:3]] == ["Hello Bob,", "The census found 42 ducks."]
    assert result.blocks[-1].text == (
        "Attachments: ducks.csv (text/csv, 8 bytes); report.pdf (application/pdf, 13 bytes)"
    )


def test_eml_html_body_goes_through_the_html_extractor():
    result = run_bytes(_email(html_only=True), "census.eml")
    assert result.status == "ok"
    assert result.blocks[1].text == "The census found 42 ducks."
    assert "x()" not in texts(result)


# --- Outlook MSG (OLE2 compound file, [MS-CFB] + [MS-OXMSG]) -----------------------------


def build_cfb(streams: dict[str, bytes]) -> bytes:
    """A minimal OLE2 compound file (v3, 512-byte sectors) holding small streams (< 4096 bytes).

    Paths use "/" between storage and stream names. Every stream lives in the mini stream;
    siblings form a chain of right links. olefile (strict mode) and extract-msg both read it.
    """
    free, end, fat_sector, none = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD, 0xFFFFFFFF
    entries: list[dict] = [{"name": "Root Entry", "type": 5, "kids": []}]
    index = {"": 0}
    for path in streams:
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            key = "/".join(parts[:depth])
            if key not in index:
                index[key] = len(entries)
                entries.append(
                    {"name": parts[depth - 1], "type": 2 if depth == len(parts) else 1, "kids": []}
                )
                entries[index["/".join(parts[: depth - 1])]]["kids"].append(index[key])
    mini, minifat = b"", []
    for path, data in streams.items():
        assert len(data) < 4096
        entry = entries[index[path]]
        entry["start"], entry["size"] = (len(mini) // 64, len(data)) if data else (end, 0)
        count = -(-len(data) // 64)
        minifat += [len(minifat) + i + 1 for i in range(count - 1)] + [end] * (count > 0)
        mini += data.ljust(count * 64, b"\0")
    n_dir, n_minifat, n_mini = -(-len(entries) // 4), -(-len(minifat) * 4 // 512), -(-len(mini) // 512)
    n_fat = 1
    while n_fat + n_dir + n_minifat + n_mini > n_fat * 128:
        n_fat += 1
    fat = [fat_sector] * n_fat

    def chain(count: int) -> int:
        start = len(fat)
        fat.extend([start + i + 1 for i in range(count - 1)] + [end] * (count > 0))
        return start if count else end

    dir_start, minifat_start, mini_start = chain(n_dir), chain(n_minifat), chain(n_mini)
    fat += [free] * (n_fat * 128 - len(fat))
    entries[0]["start"], entries[0]["size"] = mini_start, len(mini)
    for entry in entries:
        kids = entry["kids"]
        for position, kid in enumerate(kids):
            entries[kid]["right"] = kids[position + 1] if position + 1 < len(kids) else none
    directory = b"".join(
        struct.pack(
            "<64sHBBIII16sIQQIQ",
            (e["name"] + "\0").encode("utf-16-le"),
            2 * len(e["name"]) + 2,  # name length in bytes, terminator included
            e["type"],  # 1 storage, 2 stream, 5 root
            1,  # black
            none,  # left sibling
            e.get("right", none),
            e["kids"][0] if e["kids"] else none,
            b"",  # CLSID
            0,  # state bits
            0,  # created
            0,  # modified
            e.get("start", 0),
            e.get("size", 0),
        )
        for e in entries
    ).ljust(n_dir * 512, b"\0")
    header = struct.pack(
        "<8s16sHHHHH6sIIIIIIIII",
        bytes.fromhex("D0CF11E0A1B11AE1"),
        b"",  # CLSID
        0x3E,  # minor version
        3,  # major version: 512-byte sectors
        0xFFFE,  # little-endian
        9,  # sector shift (512)
        6,  # mini sector shift (64)
        b"",  # reserved
        0,  # directory sectors (0 in version 3)
        n_fat,
        dir_start,
        0,  # transaction signature
        4096,  # mini stream cutoff
        minifat_start,
        n_minifat,
        end,  # first DIFAT sector: none, the header's 109 entries suffice
        0,  # DIFAT sectors
    )
    header += struct.pack("<109I", *(list(range(n_fat)) + [free] * (109 - n_fat)))
    return (
        header
        + struct.pack(f"<{len(fat)}I", *fat)
        + directory
        + struct.pack(f"<{len(minifat)}I", *minifat).ljust(n_minifat * 512, b"\xff")
        + mini.ljust(n_mini * 512, b"\0")
    )


def _utf16(text: str) -> bytes:
    return text.encode("utf-16-le")


def _msg(message_class: str = "IPM.Note") -> bytes:
    filetime = (1714979289 + 11_644_473_600) * 10**7  # 2024-05-06 07:08:09 UTC
    properties = b"\0" * 32 + struct.pack("<II8s", 0x0039 << 16 | 0x0040, 6, struct.pack("<Q", filetime))
    attachment = "__attach_version1.0_#00000000/"
    return build_cfb(
        {
            "__properties_version1.0": properties,
            "__substg1.0_001A001F": _utf16(message_class),
            "__substg1.0_0037001F": _utf16("Quarterly duck census"),
            "__substg1.0_0C1A001F": _utf16("Alice Example"),
            "__substg1.0_5D01001F": _utf16("alice@example.org"),
            "__substg1.0_0E04001F": _utf16("Bob Example"),
            "__substg1.0_1000001F": _utf16("Hello Bob,\r\n\r\nThe census found 42 ducks.\r\n"),
            attachment + "__properties_version1.0": b"\0" * 8,
            attachment + "__substg1.0_3707001F": _utf16("ducks.csv"),
            attachment + "__substg1.0_370E001F": _utf16("text/csv"),
            attachment + "__substg1.0_37010102": b"a,b\n1,2\n",
        }
    )


def test_msg_headers_body_and_attachments():
    result = run_bytes(_msg(), "census.msg")
    assert result.status == "ok", result.reason
    assert result.content_type == "application/vnd.ms-outlook"
    assert result.blocks[0].text.split("\n") == [
        "From: Alice Example <alice@example.org>",
        "To: Bob Example",
        "Date: Mon, 06 May 2024 07:08:09 +0000",
        "Subject: Quarterly duck census",
    ]
    assert [b.text for b in result.blocks[1:]] == [
        "Hello Bob,",
        "The census found 42 ducks.",
        "Attachments: ducks.csv (text/csv, 8 bytes)",
    ]


def test_msg_smime_encrypted_fails_as_encrypted():
    result = run_bytes(_msg("IPM.Note.SMIME"), "secret.msg")
    assert (result.status, result.reason) == ("failed", "encrypted/password-protected")


# --- encrypted / hostile packages --------------------------------------------------------


@pytest.mark.parametrize("name", ["locked.docx", "locked.xlsx", "locked.pptx"])
def test_password_protected_ooxml_fails_as_encrypted(name):
    # Office wraps a password-protected OOXML package in an OLE2 file with these two streams.
    data = build_cfb(
        {"EncryptionInfo": b"\x04\x00\x04\x00\x40\x00\x00\x00", "EncryptedPackage": b"\x01" * 600}
    )
    result = run_bytes(data, name)
    assert (result.status, result.reason) == ("failed", "encrypted/password-protected")


def test_really_encrypted_docx_fails_as_encrypted(data):
    from msoffcrypto.format import ooxml

    encrypted = io.BytesIO()
    with (data / "lorem_ipsum.docx").open("rb") as plain:
        ooxml.OOXMLFile(plain).encrypt("secret", encrypted)
    result = run_bytes(encrypted.getvalue(), "lorem.docx")
    assert (result.status, result.reason) == ("failed", "encrypted/password-protected")


def test_zip_bomb_is_refused_before_inflating():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("[Content_Types].xml", "<Types/>")
        package.writestr("word/document.xml", b"\0" * (48 << 20))
    result = run_bytes(buffer.getvalue(), "bomb.docx")
    assert result.status == "failed" and "zip bomb" in result.reason


# --- JSON / XML --------------------------------------------------------------------------


def test_json_flattened_to_path_value_lines():
    doc = {
        "name": "census",
        "ducks": [{"kind": "mallard", "count": 42}, {"kind": "teal", "ok": True}],
        "notes": None,
        "tags": [],
    }
    result = run_bytes(json.dumps(doc).encode(), "census.json")
    assert result.status == "ok"
    assert texts(result).split("\n") == [
        "name: census",
        "ducks[0].kind: mallard",
        "ducks[0].count: 42",
        "ducks[1].kind: teal",
        "ducks[1].ok: true",
        "notes: null",
        "tags: []",
    ]


def test_json_invalid_and_hostile_inputs_fail_cleanly():
    assert run_bytes(b'{"a": [1, 2,', "broken.json").status == "failed"
    deep = run_bytes(b"[" * 200_000 + b"]" * 200_000, "deep.json")
    assert deep.status == "failed"
    lines = run_bytes(b'{"a": 1}\nnot json\n{"b": {"c": 2}}\n', "rows.jsonl")
    assert lines.status == "partial" and "line 2" in lines.reason
    assert texts(lines).split("\n") == ["[1].a: 1", "[3].b.c: 2"]


def test_xml_text_in_document_order():
    xml = (
        b"<?xml version='1.0'?><catalog><book id='1'><title>Ducks</title> and <b>geese</b>!</book></catalog>"
    )
    result = run_bytes(xml, "catalog.xml")
    assert result.status == "ok"
    assert texts(result).split("\n") == ["Ducks", "and", "geese", "!"]


def test_xml_billion_laughs_is_not_expanded():
    levels = "".join(f'<!ENTITY l{i} "{f"&l{i - 1};" * 10}">' for i in range(1, 10))
    bomb = f'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY l0 "lol">{levels}]><lolz>&l9;</lolz>'
    with peak_memory() as peak:
        result = run_bytes(bomb.encode(), "lolz.xml")
    assert peak.bytes < 16 * 2**20  # expanded, &l9; is 3 GB of "lol"
    assert result.status == "failed" and "unsafe XML" in result.reason
    assert "lol" not in texts(result)


def test_xml_external_entity_is_not_fetched(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    xxe = f'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file://{secret}">]><r>&x;</r>'
    result = run_bytes(xxe.encode(), "xxe.xml")
    assert result.status == "failed" and "unsafe XML" in result.reason
    assert "TOP-SECRET" not in texts(result) + (result.reason or "")


# --- ODT / EPUB / RTF --------------------------------------------------------------------

_ODF_NS = (
    'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
    'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
    'xmlns:table="urn:oasis:names:tc:opendocument:xmlns:table:1.0"'
)


def _zip(members: dict[str, str | bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as package:
        for name, data in members.items():
            package.writestr(name, data)
    return buffer.getvalue()


def test_odt_paragraphs_lists_and_tables():
    content = (
        f"<office:document-content {_ODF_NS}><office:body><office:text>"
        "<text:h>Duck report</text:h><text:p>Ducks<text:s text:c='2'/>swim.<text:tab/>Often.</text:p>"
        "<text:list><text:list-item><text:p>Mallard</text:p></text:list-item></text:list>"
        "<table:table><table:table-row><table:table-cell><text:p>kind</text:p></table:table-cell>"
        "<table:table-cell><text:p>count</text:p></table:table-cell></table:table-row></table:table>"
        "</office:text></office:body></office:document-content>"
    )
    data = _zip({"mimetype": "application/vnd.oasis.opendocument.text", "content.xml": content})
    result = run_bytes(data, "report.odt")
    assert result.status == "ok"
    assert [b.text for b in result.blocks] == [
        "Duck report",
        "Ducks  swim.\tOften.",
        "Mallard",
        "kind | count",
    ]
    manifest = (
        '<manifest:manifest xmlns:manifest="urn:oasis:names:tc:opendocument:xmlns:manifest:1.0">'
        "<manifest:file-entry><manifest:encryption-data/></manifest:file-entry></manifest:manifest>"
    )
    locked = run_bytes(_zip({"content.xml": b"\x93garbled", "META-INF/manifest.xml": manifest}), "locked.odt")
    assert (locked.status, locked.reason) == ("failed", "encrypted/password-protected")


def test_epub_spine_order_with_chapter_locators():
    opf = (
        '<package xmlns="http://www.idpf.org/2007/opf" version="3.0">'
        '<metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>Duck Tales</dc:title></metadata>'
        '<manifest><item id="c2" href="text/ch2.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="c1" href="text/ch1.xhtml" media-type="application/xhtml+xml"/>'
        '<item id="css" href="style.css" media-type="text/css"/></manifest>'
        '<spine><itemref idref="c1"/><itemref idref="c2"/></spine></package>'
    )
    container = (
        '<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container" version="1.0"><rootfiles>'
        '<rootfile full-path="OEBPS/book.opf" media-type="application/oebps-package+xml"/>'
        "</rootfiles></container>"
    )
    data = _zip(
        {
            "mimetype": "application/epub+zip",
            "META-INF/container.xml": container,
            "OEBPS/book.opf": opf,
            "OEBPS/text/ch1.xhtml": "<html><body><h1>One</h1><p>Ducks hatch.</p></body></html>",
            "OEBPS/text/ch2.xhtml": "<html><body><h1>Two</h1><p>Ducks fly.</p></body></html>",
        }
    )
    result = run_bytes(data, "tales.epub")
    assert result.status == "ok" and result.title == "Duck Tales"
    assert [(b.page_no, b.text) for b in result.blocks] == [
        (1, "One"),
        (1, "Ducks hatch."),
        (2, "Two"),
        (2, "Ducks fly."),
    ]


def test_rtf_paragraphs():
    rtf = (
        rb"{\rtf1\ansi\deff0{\fonttbl{\f0 Times;}}"
        rb"\pard Caf\'e9 \b ducks\b0  swim.\par Second \u8364? line.\par}"
    )
    result = run_bytes(rtf, "note.rtf")
    assert result.status == "ok"
    assert [b.text for b in result.blocks] == ["Café ducks swim.", "Second € line."]


# --- registry and whole corpus -----------------------------------------------------------


def test_registry_covers_the_new_formats():
    registered = supported_extensions()
    for ext in (
        ".pdf",
        ".docx",
        ".pptx",
        ".xlsx",
        ".csv",
        ".eml",
        ".msg",
        ".json",
        ".xml",
        ".vtt",
        ".srt",
        ".odt",
        ".epub",
        ".rtf",
    ):
        assert ext in registered
    assert registered[".msg"] == "application/vnd.ms-outlook"
    assert registered[".srt"] == "application/x-subrip"


def test_whole_corpus_sweep_every_file_gets_a_status(data):
    files = sorted(p for p in data.iterdir() if p.is_file())
    counts: Counter[tuple[str, str]] = Counter()
    start = time.perf_counter()
    for path in files:
        result = run_file(path)  # must not raise
        assert result.status in {"ok", "partial", "failed", "skipped"}
        assert result.status == "ok" or result.reason, path
        counts[(path.suffix or path.name, result.status)] += 1
    elapsed = time.perf_counter() - start
    print(f"\ncorpus sweep: {len(files)} files in {elapsed:.1f}s")
    for (suffix, status), count in sorted(counts.items()):
        print(f"  {suffix:8} {status:8} {count}")
    assert counts[(".pdf", "failed")] == 1  # the password-protected one
    assert counts[(".pdf", "skipped")] == 1  # the image-only page
    for suffix in (".docx", ".pptx", ".xlsx", ".csv", ".vtt"):
        assert not counts[(suffix, "failed")], suffix
