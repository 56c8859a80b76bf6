"""Word, Excel and PowerPoint 97-2003 (.doc, .xls, .ppt): text, locators, encryption, damage, misnamed files.

The samples in tests/data/legacy were written by LibreOffice from OOXML that make_samples.py generates
(the password-protected ones with real RC4 encryption); word-mac-fox.doc (Word for Mac, textract, MIT),
word-2007.doc, powerpoint-2007.ppt and powerpoint-encrypted.ppt (Office 2007, oletools, BSD) were written by
Microsoft Office. Damaged and flag-carrying variants are derived here from those bytes with olefile.
The extractors are called directly where the test is that they never raise.
"""

from __future__ import annotations

import importlib.util
import io
import re
import shutil
import struct
from pathlib import Path

import msoffcrypto
import olefile
import pytest
from kdbl_worker.extract import Extraction, Source, extract, supported_extensions
from kdbl_worker.extract.doc import extract_doc
from kdbl_worker.extract.ppt import extract_ppt
from kdbl_worker.extract.xls import extract_xls

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy"
ENCRYPTED = ("failed", "encrypted/password-protected")
EXTRACTORS = {".doc": extract_doc, ".xls": extract_xls, ".ppt": extract_ppt}

HERON = [
    "Heron migration report",
    "The grey heron (Ardea cinerea) winters in the marshes near Lake Kerkini.",
    "Café owners in Zürich counted 42 herons; costs were €1,250 in total.",
    "Ελληνικά: ερωδιός. Русский: цапля. 日本語: サギ.",
    "Field notes are at the survey site for everyone.",  # a HYPERLINK field: its code is dropped
    "Site\tCount",
    "Kerkini\t42",
    "Closing line with the marker word zanzibarheron.",
]
LIGHTHOUSE = [
    (1, "Lighthouse keeping\nA short course for new keepers"),
    (2, ("Daily duties\nTrim the wick\nPolish the Fresnel lens\nLogbook entry: marker word pelorusppt\n"
         "Notes: Speaker notes: mention the storm of 1703.")),
    (3, "Phare d’Eckmühl — questions?"),
]


def run(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


def direct(data: bytes, name: str) -> Extraction:
    """The format's extractor itself, without the dispatcher's safety net."""
    return EXTRACTORS[Path(name).suffix](Source(io.BytesIO(data), name, len(data)))


def sample(name: str) -> bytes:
    return (LEGACY / name).read_bytes()


def rewrite_stream(tmp_path: Path, name: str, stream: str, edit) -> bytes:
    """A copy of a sample with one OLE2 stream changed in place (same size), as damage or flags would be."""
    path = tmp_path / name
    shutil.copy(LEGACY / name, path)
    with olefile.OleFileIO(str(path), write_mode=True) as ole:
        data = bytearray(ole.openstream(stream).read())
        edit(data)
        ole.write_stream(stream, bytes(data))
    return path.read_bytes()


def decrypt(data: bytes) -> bytes:
    office = msoffcrypto.OfficeFile(io.BytesIO(data))
    office.load_key(password="secret")
    out = io.BytesIO()
    office.decrypt(out)
    return out.getvalue()


def test_word_97_document_gives_paragraphs_table_rows_and_unicode_without_field_codes():
    result = run(sample("heron.doc"), "heron.doc")
    assert (result.status, result.reason, result.content_type) == ("ok", None, "application/msword")
    assert result.title == "Heron migration report"
    assert [b.text for b in result.blocks] == HERON
    assert all(b.page_no is None for b in result.blocks)


def test_word_field_codes_are_dropped_and_their_results_kept_also_when_nested():
    from kdbl_worker.extract.doc import _paragraphs

    story = ('See \x13 HYPERLINK "https://example.org" \x14the site\x15 and page \x13 PAGE \x15.\r'
             "\x13 IF \x13 DATE \x14today\x15 = x \x14nested result\x15 stays\r")
    assert _paragraphs(story) == ["See the site and page .", "nested result stays"]


def test_word_for_mac_document_with_8_bit_pieces_reads_like_antiword():
    result = run(sample("word-mac-fox.doc"), "fox.doc")
    assert result.status == "ok"
    assert [b.text for b in result.blocks] == ["the quick brown fox jumps over the lazy dog"]


def test_word_2007_document_reads_like_antiword():
    result = run(sample("word-2007.doc"), "clean.doc")
    assert result.status == "ok"
    assert [b.text for b in result.blocks] == [
        "Test",
        "This is a harmless test document.",
        ("It contains neither macros nor dde links nor embedded viruses nor links to evil web pages. "
        "Not even a single insult. Boring!"),
        ("Just to make things slightly interesting, however, we add some ünicöde-ßtringß and different text "
        "sizes, colors and fonts"),
    ]


def test_excel_97_workbook_reads_exactly_like_the_xlsx_it_was_saved_from(tmp_path):
    spec = importlib.util.spec_from_file_location("make_samples", LEGACY / "make_samples.py")
    make_samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_samples)
    make_samples.make_xlsx(tmp_path / "tides.xlsx")
    xlsx = run((tmp_path / "tides.xlsx").read_bytes(), "tides.xlsx")
    xls = run(sample("tides.xls"), "tides.xls")
    assert (xls.status, xls.content_type, xls.title) == ("ok", "application/vnd.ms-excel", "Tide tables")
    assert [(b.page_no, b.text) for b in xls.blocks] == [(b.page_no, b.text) for b in xlsx.blocks]
    first = xls.blocks[0].text.splitlines()
    assert first == ["Sheet: Tides", "Port | High water | Height m | Spring",
                     "Brest | 2024-03-09T06:41:00 | 7.25 | True", "Saint-Malo | 2024-03-09T07:02:00 | 12 | False",
                     "Note | marker word quillonxls"]
    ports = [b for b in xls.blocks if b.page_no == 2]
    assert [len(b.text.splitlines()) for b in ports] == [51, 12]  # header line + 50 rows, then the other 11
    assert all(b.text.startswith("Sheet: Ports ÄÖÜ\n") for b in ports)


def test_excel_cell_cap_gives_partial_with_the_sheet_named():
    result = extract_xls(Source(io.BytesIO(sample("tides.xls")), "tides.xls", 1), max_cells=20)
    assert result.status == "partial"
    assert "cell cap reached (20 cells) in sheet 'Ports ÄÖÜ'" in result.reason


def test_powerpoint_97_slides_are_pages_with_text_boxes_and_speaker_notes():
    result = run(sample("lighthouse.ppt"), "lighthouse.ppt")
    assert (result.status, result.reason) == ("ok", None)
    assert result.content_type == "application/vnd.ms-powerpoint"
    assert result.title == "Lighthouse keeping"
    assert [(b.page_no, b.text) for b in result.blocks] == LIGHTHOUSE


def test_powerpoint_2007_deck_keeps_its_text_in_the_slide_shapes_and_is_read():
    # Debian's catppt prints only the master names ("Office Theme") for this file
    result = run(sample("powerpoint-2007.ppt"), "embedded.ppt")
    assert (result.status, result.title) == ("ok", "Embedded Objects")
    assert [(b.page_no, b.text) for b in result.blocks] == [
        (1, "Embedded Objects\nThis slide contains an embedded object\nIt is a simple harmless ASCII text file")]


def test_presentation_encrypted_by_powerpoint_fails_as_encrypted():
    result = run(sample("powerpoint-encrypted.ppt"), "locked.ppt")
    assert (result.status, result.reason) == ENCRYPTED


@pytest.mark.parametrize("name", ["heron-locked.doc", "tides-locked.xls"])
def test_password_protected_doc_and_xls_fail_as_encrypted(name):
    data = sample(name)
    assert (run(data, name).status, run(data, name).reason) == ENCRYPTED
    # really RC4-encrypted, not just flagged: the password opens it and the text is the plain sample's
    plain = sample(name.replace("-locked", ""))
    opened = run(decrypt(data), name)
    assert opened.status == "ok"
    assert [b.text for b in opened.blocks] == [b.text for b in run(plain, name).blocks]


def test_presentation_with_the_encrypted_header_token_fails_as_encrypted(tmp_path):
    # LibreOffice cannot encrypt .ppt and msoffcrypto-tool encrypts only OOXML: the Current User record
    # gets the token PowerPoint writes for an encrypted file ([MS-PPT] 2.3.2, 0xF3D1C4DF).
    data = rewrite_stream(tmp_path, "lighthouse.ppt", "Current User",
                          lambda cu: struct.pack_into("<I", cu, 12, 0xF3D1C4DF))
    assert (direct(data, "locked.ppt").status, direct(data, "locked.ppt").reason) == ENCRYPTED


def test_word_document_with_the_obfuscation_flag_fails_as_encrypted(tmp_path):
    def flag(word: bytearray) -> None:
        struct.pack_into("<H", word, 0x0A, struct.unpack_from("<H", word, 0x0A)[0] | 0x8000)

    data = rewrite_stream(tmp_path, "heron.doc", "WordDocument", flag)
    assert (direct(data, "xor.doc").status, direct(data, "xor.doc").reason) == ENCRYPTED


@pytest.mark.parametrize("name", ["heron.doc", "tides.xls", "lighthouse.ppt", "word-mac-fox.doc",
                                  "word-2007.doc", "powerpoint-2007.ppt"])
@pytest.mark.parametrize("fraction", [0.02, 0.3, 0.6, 0.95])
def test_a_truncated_file_ends_with_a_status_and_reason_never_an_exception(name, fraction):
    data = sample(name)
    cut = data[: int(len(data) * fraction)]
    result = direct(cut, name)
    assert result.status == "ok" or result.reason, result
    if fraction < 0.9:  # past the text: whether a 5% cut hurts depends on what the writer put last
        assert result.status in ("failed", "partial"), result


def test_word_piece_table_pointing_past_the_text_is_partial(tmp_path):
    def stretch(word: bytearray) -> None:
        struct.pack_into("<I", word, 0x4C, 40_000)  # ccpText: far more characters than the pieces hold

    data = rewrite_stream(tmp_path, "heron.doc", "WordDocument", stretch)
    result = direct(data, "long.doc")
    assert result.status == "partial" and "text cut short: 374 of 40000 characters" in result.reason
    assert [b.text for b in result.blocks] == HERON


def test_word_document_without_a_piece_table_fails_as_corrupt(tmp_path):
    def wipe(table: bytearray) -> None:
        table[:] = bytes(len(table))

    data = rewrite_stream(tmp_path, "heron.doc", "1Table", wipe)
    result = direct(data, "noclx.doc")
    assert (result.status, result.reason) == ("failed", "corrupt Word document: no piece table in the CLX")


def test_word_95_document_is_skipped_as_unsupported(tmp_path):
    data = rewrite_stream(tmp_path, "heron.doc", "WordDocument", lambda w: struct.pack_into("<H", w, 2, 104))
    result = direct(data, "old.doc")
    assert (result.status, result.reason) == ("skipped", "Word 6.0/95 document (nFib 104), not supported")


def test_presentation_with_a_broken_edit_chain_keeps_its_slides_in_stream_order(tmp_path):
    def misdirect(user: bytearray) -> None:
        struct.pack_into("<I", user, 16, 7)  # offsetToCurrentEdit: not a UserEditAtom

    data = rewrite_stream(tmp_path, "lighthouse.ppt", "Current User", misdirect)
    result = direct(data, "broken.ppt")
    assert result.status == "partial" and result.reason.startswith("persistence chain broken")
    titles = [b.text.split("\n")[0] for b in result.blocks]
    assert titles == ["Lighthouse keeping", "Daily duties", "Phare d’Eckmühl — questions?"]


def test_a_doc_that_is_really_rtf_is_extracted_as_rtf():
    result = run(sample("heron-word.rtf"), "heron.doc")
    assert (result.status, result.content_type) == ("ok", "application/rtf")
    assert result.reason == "RTF content in a .doc file"
    assert "Closing line with the marker word zanzibarheron." in [b.text for b in result.blocks]


def test_a_doc_that_is_really_a_web_page_is_extracted_as_html():
    page = ("<html xmlns:w='urn:schemas-microsoft-com:office:word'><head><title>Minutes</title></head>"
            "<body><p>The board approved the osprey budget.</p></body></html>").encode("utf-16")
    result = run(page, "minutes.doc")
    assert (result.status, result.content_type) == ("ok", "text/html")
    assert "osprey budget" in "\n".join(b.text for b in result.blocks)


def test_a_doc_that_is_really_a_single_file_web_page_is_extracted_from_its_html_part():
    mhtml = (b'MIME-Version: 1.0\nContent-Type: multipart/related; boundary="----=_NextPart_01D"\n\n'
             b"This document is a Single File Web Page, also known as a Web Archive file.\n\n"
             b"------=_NextPart_01D\nContent-Location: file:///C:/minutes.htm\n"
             b"Content-Transfer-Encoding: quoted-printable\n"
             b'Content-Type: text/html; charset="windows-1252"\n\n'
             b"<html><body><p class=3DMsoNormal>The board approved the caf=E9 budget.</p></body></html>\n\n"
             b"------=_NextPart_01D--\n")
    result = run(mhtml, "minutes.doc")
    assert (result.status, result.reason) == ("ok", "MHTML (web archive) content in a .doc file")
    assert [b.text for b in result.blocks] == ["The board approved the café budget."]


def test_an_xls_that_is_really_excels_unicode_text_is_read_as_rows():
    # Excel's "Unicode Text" export: UTF-16 with a BOM, tab-separated, often saved with an .xls name
    result = run("Region\tSales\nNörth\t1200\nSouth\t900\n".encode("utf-16"), "export.xls")
    assert result.status == "ok" and result.reason.startswith("delimited text content in a .xls file")
    assert [b.text for b in result.blocks] == ["Region\tSales\nNörth\t1200\nSouth\t900"]


def test_a_doc_saved_as_plain_text_is_indexed_as_text():
    result = run(b"Meeting notes\n\nThe ospreys returned to the lake.\n", "notes.doc")
    assert (result.status, result.content_type) == ("ok", "text/plain")
    assert result.reason.startswith("plain text content in a .doc file")
    assert "ospreys returned" in "\n".join(b.text for b in result.blocks)


def test_a_docx_renamed_to_doc_is_read_as_docx():
    docx = (Path(__file__).resolve().parents[1] / "data" / "docs" / "lorem_ipsum.docx").read_bytes()
    result = run(docx, "lorem.doc")
    assert result.status == "ok" and result.content_type.endswith("wordprocessingml.document")


@pytest.mark.parametrize(("name", "ooxml"), [("heron.doc", "heron.docx"), ("tides.xls", "tides.xlsx"),
                                             ("lighthouse.ppt", "lighthouse.pptx")])
def test_a_legacy_file_under_an_ooxml_name_is_read_by_the_legacy_reader(name, ooxml):
    right, misnamed = run(sample(name), name), run(sample(name), ooxml)
    assert misnamed.status == "ok" and misnamed.content_type == right.content_type
    assert [(b.page_no, b.text) for b in misnamed.blocks] == [(b.page_no, b.text) for b in right.blocks]


@pytest.mark.parametrize("name", ["junk.doc", "junk.xls", "junk.ppt"])
def test_binary_junk_with_a_legacy_name_fails_with_a_reason(name):
    junk = bytes(range(256)) * 64 + b"\x00\xff" * 1000
    result = direct(junk, name)
    assert result.status == "failed" and re.match(r"not an? (Word|Excel|PowerPoint) 97-2003 file", result.reason)


@pytest.mark.parametrize("name", ["heron.doc", "tides.xls", "lighthouse.ppt"])
def test_an_ole2_file_of_another_kind_fails_with_a_reason(name):
    other = sample("lighthouse.ppt" if name.endswith(".doc") else "heron.doc")
    result = direct(other, name)
    assert result.status == "failed" and result.reason.startswith("not a")


def test_registry_reads_the_legacy_office_formats():
    registered = supported_extensions()
    assert registered[".doc"] == "application/msword"
    assert registered[".xls"] == "application/vnd.ms-excel"
    assert registered[".ppt"] == "application/vnd.ms-powerpoint"
