"""Files in other encodings than UTF-8 extract to the right text, with the encoding in the status reason.

Every sample is generated here: German, French, Russian, Japanese and Chinese prose encoded with a BOM,
as UTF-16/UTF-32 without one, and in the legacy 8-bit and multi-byte encodings a real share holds; the
same decoding serves text, CSV, e-mail, XML, JSON, HTML, Markdown and subtitles. Binary junk is still
refused. Plain UTF-8 keeps a status without a reason.
"""

from __future__ import annotations

import codecs
import io
import json
import random
from email.message import EmailMessage

import pytest
from kdbl_worker.extract import Extraction, Source, extract
from kdbl_worker.extract.containers import Bounds, Budget, expand
from kdbl_worker.extract.encoding import DETECT_BYTES, decode

PROSE = {
    "de": "Die Bürger äußerten sich über die Gebühren der Straßenbahn. Größere Änderungen müssen "
          "überprüft werden, bevor der Stadtrat im Frühjahr über die Fußgängerzone abstimmt.\n\n"
          "Die Grünfläche hinter dem Rathaus bleibt öffentlich zugänglich.\n",
    "fr": "L'été dernier, nous sommes allés à la fête du château près de Genève. Les élèves ont "
          "préparé une crème brûlée et un gâteau aux pêches pour la kermesse.\n\n"
          "Où est la bibliothèque ? Elle se trouve derrière l'église, à côté du théâtre.\n",
    "ru": "Москва является столицей России и крупнейшим городом страны. Съешь же ещё этих мягких "
          "французских булок, да выпей чаю.\n\nВ библиотеке хранятся старинные рукописи и книги.\n",
    "ja": "吾輩は猫である。名前はまだ無い。どこで生れたかとんと見当がつかぬ。何でも薄暗いじめじめした所で"
          "ニャーニャー泣いていた事だけは記憶している。\n\n図書館には古い写本と書籍が保管されている。\n",
    "zh": "北京是中华人民共和国的首都，也是全国的政治和文化中心。图书馆里保存着许多古老的手稿和书籍。\n\n"
          "春天的时候，公园里开满了花，很多人来这里散步。\n",
}
WORD = {"de": "Fußgängerzone", "fr": "bibliothèque", "ru": "рукописи", "ja": "図書館", "zh": "图书馆"}


def run(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


def text_of(result: Extraction) -> str:
    return "\n\n".join(block.text for block in result.blocks)


@pytest.mark.parametrize(("lang", "encode", "reason"), [
    ("de", "utf-8", None),
    ("ja", "utf-8", None),
    ("fr", "utf-8-sig", None),
    ("de", "utf-16", "encoding: utf-16-le (BOM)"),
    ("ru", codecs.BOM_UTF16_BE, "encoding: utf-16-be (BOM)"),
    ("zh", "utf-32", "encoding: utf-32-le (BOM)"),
    ("ja", codecs.BOM_UTF32_BE, "encoding: utf-32-be (BOM)"),
    ("de", "utf-16-le", "encoding: utf-16-le (detected)"),
    ("fr", "utf-16-be", "encoding: utf-16-be (detected)"),
    ("ru", "utf-16-le", "encoding: utf-16-le (detected)"),
    ("ja", "utf-16-le", "encoding: utf-16-le (detected)"),
    ("zh", "utf-16-be", "encoding: utf-16-be (detected)"),
    ("fr", "utf-32-le", "encoding: utf-32-le (detected)"),
    ("zh", "utf-32-be", "encoding: utf-32-be (detected)"),
    ("de", "cp1252", "encoding: windows-1252 (detected)"),
    ("fr", "cp1252", "encoding: windows-1252 (detected)"),
    ("de", "latin-1", "encoding: windows-1252 (detected)"),
    ("fr", "latin-1", "encoding: windows-1252 (detected)"),
    ("ru", "cp1251", "encoding: windows-1251 (detected)"),
    ("ru", "koi8-r", "encoding: koi8-r (detected)"),
    ("ja", "shift_jis", "encoding: shift_jis (detected)"),
    ("ja", "euc-jp", "encoding: euc-jp (detected)"),
    ("zh", "gb18030", "encoding: gb18030 (detected)"),
    ("zh", "gb2312", "encoding: gb18030 (detected)"),
])
def test_text_in_any_common_encoding_extracts_to_its_text_with_the_encoding_in_the_reason(
        lang, encode, reason):
    prose = PROSE[lang]
    if isinstance(encode, bytes):  # a BOM the codec does not write itself (big-endian)
        data = encode + prose.encode("utf-16-be" if len(encode) == 2 else "utf-32-be")
    else:
        data = prose.encode(encode)
    result = run(data, f"{lang}.txt")
    assert (result.status, result.reason) == ("ok", reason)
    assert text_of(result) == prose.strip("\n")
    assert WORD[lang] in text_of(result)


def test_a_two_word_latin_1_note_is_read_as_windows_1252_not_a_far_eastern_code_page():
    result = run("café crème".encode("latin-1"), "note.txt")
    assert (result.status, result.reason, text_of(result)) == ("ok", "encoding: windows-1252 (detected)",
                                                                 "café crème")


@pytest.mark.parametrize(("name", "data", "reason"), [
    ("nul.txt", b"\x00\x01\x02\x03 junk", "binary content (NUL bytes) in a text file"),
    ("elf.txt", b"\x7fELF\x02\x01\x01\x00" + bytes(8) + b"\x02\x00\x3e\x00" + bytes(range(256)) * 8,
     "binary content (NUL bytes) in a text file"),
    ("random.txt", random.Random(3).randbytes(4096), "binary content (NUL bytes) in a text file"),
    ("controls.txt", b"\x01\x02\x03\x04\x05\x06\x07\x08 abc" * 200,
     "binary content (control characters) in a text file"),
    ("bom-then-junk.txt", codecs.BOM_UTF16_LE + bytes([1, 0, 2, 0, 3, 0, 4, 0]) * 300,
     "binary content (control characters) in a text file"),
])
def test_binary_junk_is_still_refused_when_its_nul_bytes_fit_no_wide_encoding(name, data, reason):
    result = run(data, name)
    assert (result.status, result.reason) == ("failed", reason)


def test_many_random_binaries_are_never_taken_for_utf_16_or_utf_32():
    rng = random.Random(14)
    taken = [d.note for d in (decode(rng.randbytes(rng.choice([1000, 8192, 20000]))) for _ in range(300))
             if d.text is not None]
    assert taken == []


def test_bytes_that_do_not_decode_are_replaced_and_only_then_the_status_is_partial():
    odd_utf16 = codecs.BOM_UTF16_LE + PROSE["de"].encode("utf-16-le") + b"\x41"
    result = run(odd_utf16, "odd.txt")
    assert result.status == "partial"
    assert result.reason == "encoding: utf-16-le (BOM); undecodable bytes replaced (first at offset " \
        f"{len(odd_utf16) - 3})"
    assert WORD["de"] in text_of(result)
    # UTF-8 with one stray byte stays UTF-8 (not re-read as a legacy code page): one character lost
    utf8 = PROSE["ru"].encode() + b"\xff" + PROSE["ru"].encode()
    result = run(utf8, "stray.txt")
    assert result.status == "partial"
    assert result.reason.startswith("not valid UTF-8 (first bad byte at offset")
    assert text_of(result).count(WORD["ru"]) == 2 and "\ufffd" in text_of(result)


def test_only_a_bounded_prefix_decides_the_legacy_encoding():
    # 64 KiB and more of windows-1251, then 2 MB of KOI8-R: a detector over the whole file would pick KOI8-R
    head = PROSE["ru"] * (DETECT_BYTES // len(PROSE["ru"].encode("cp1251")) + 1)
    tail = PROSE["ru"] * (2_000_000 // len(PROSE["ru"]))
    data = head.encode("cp1251") + tail.encode("koi8-r")
    decoded = decode(data)
    assert decoded.note == "encoding: windows-1251 (detected)" and decoded.text.startswith(head)


def test_a_declared_charset_is_used_when_the_bytes_are_not_utf_8_and_valid_utf_8_beats_a_wrong_one():
    assert decode(PROSE["fr"].encode("latin-1"), "ISO-8859-1").note == "encoding: iso-8859-1 (declared)"
    assert decode(PROSE["fr"].encode("utf-8"), "ISO-8859-1").note is None
    wrong = decode(PROSE["ru"].encode("cp1251"), "utf-8")
    assert wrong.note == "encoding: windows-1251 (detected; declared utf-8)" and wrong.text == PROSE["ru"]
    unknown = decode(PROSE["ru"].encode("koi8-r"), "x-no-such-charset")
    assert unknown.note == "encoding: koi8-r (detected)" and unknown.text == PROSE["ru"]


# -- CSV, Markdown, subtitles, HTML ------------------------------------------------------------------

def test_csv_saved_as_utf_16_tab_separated_unicode_text_reads_its_rows():
    table = "Stadt\tEinwohner\tFläche\nMünchen\t1488000\t310,7\nKöln\t1084000\t405,0\n"
    result = run(codecs.BOM_UTF16_LE + table.encode("utf-16-le"), "cities.csv")
    assert (result.status, result.reason) == ("ok", "encoding: utf-16-le (BOM)")
    assert text_of(result) == "Stadt\tEinwohner\tFläche\nMünchen\t1488000\t310,7\nKöln\t1084000\t405,0"


def test_csv_in_windows_1251_reads_its_cyrillic_rows_with_an_ok_status():
    table = "Город;Население\nМосква;13010112\nСанкт-Петербург;5601911\nНовосибирск;1633595\n" * 3
    result = run(table.encode("cp1251"), "города.csv")
    assert (result.status, result.reason) == ("ok", "encoding: windows-1251 (detected)")
    assert "Санкт-Петербург\t5601911" in text_of(result)


def test_markdown_in_windows_1252_keeps_its_heading_as_title():
    doc = "# Crème brûlée\n\n" + PROSE["fr"]
    result = run(doc.encode("cp1252"), "dessert.md")
    assert (result.status, result.reason, result.title) == ("ok", "encoding: windows-1252 (detected)",
                                                            "Crème brûlée")


def test_subrip_subtitles_in_windows_1251_keep_their_cues_and_times():
    srt = ("1\n00:00:01,000 --> 00:00:03,500\nДобрый вечер, Москва.\n\n"
           "2\n00:00:04,000 --> 00:00:06,000\nВ библиотеке хранятся старинные рукописи.\n")
    result = run(srt.encode("cp1251"), "film.srt")
    assert (result.status, result.reason) == ("ok", "encoding: windows-1251 (detected)")
    assert [(b.text, b.ts_start_ms) for b in result.blocks] == [
        ("Добрый вечер, Москва.", 1000), ("В библиотеке хранятся старинные рукописи.", 4000)]


def test_html_uses_its_meta_charset_when_the_bytes_are_not_utf_8():
    page = ('<html><head><meta http-equiv="Content-Type" content="text/html; charset=windows-1251">'
            "<title>Библиотека</title></head><body><main><p>" + PROSE["ru"] + "</p></main></body></html>")
    result = run(page.encode("cp1251"), "page.html")
    assert (result.status, result.reason, result.title) == ("ok", "encoding: windows-1251 (declared)",
                                                            "Библиотека")
    assert WORD["ru"] in text_of(result)


def test_html_without_a_charset_in_shift_jis_is_detected():
    page = "<html><body><main><p>" + PROSE["ja"] + "</p></main></body></html>"
    result = run(page.encode("shift_jis"), "neko.html")
    assert (result.status, result.reason) == ("ok", "encoding: shift_jis (detected)")
    assert WORD["ja"] in text_of(result)


# -- XML and JSON -------------------------------------------------------------------------------------

def _xml(declared: str | None) -> str:
    decl = f'<?xml version="1.0" encoding="{declared}"?>\n' if declared else ""
    return f'{decl}<notes><note lang="de">{PROSE["de"]}</note><note>{PROSE["ja"]}</note></notes>'


@pytest.mark.parametrize(("data", "reason"), [
    (codecs.BOM_UTF16_LE + _xml("UTF-16").encode("utf-16-le"), "encoding: utf-16-le (BOM)"),
    (_xml("UTF-16").encode("utf-16-be"), "encoding: utf-16-be (detected)"),
    (_xml(None).encode("utf-16-le"), "encoding: utf-16-le (detected)"),
    # the declaration disagrees with the bytes: the bytes win
    (codecs.BOM_UTF16_LE + _xml("ISO-8859-1").encode("utf-16-le"), "encoding: utf-16-le (BOM)"),
    (_xml("UTF-8").replace(PROSE["ja"], "").encode("cp1252"),
     "encoding: windows-1252 (detected; declared utf-8)"),
    (_xml("UTF-16").encode("utf-8"), None),
])
def test_xml_in_utf_16_or_with_a_wrong_declaration_extracts_its_text(data, reason):
    result = run(data, "notes.xml")
    assert (result.status, result.reason) == ("ok", reason)
    assert WORD["de"] in text_of(result)


def test_latin_1_xml_declared_as_such_says_so():
    result = run(_xml("ISO-8859-1").replace(PROSE["ja"], "").encode("latin-1"), "notes.xml")
    assert (result.status, result.reason) == ("ok", "encoding: iso-8859-1 (declared)")
    assert WORD["de"] in text_of(result)


@pytest.mark.parametrize(("encode", "reason"), [
    ("utf-16", "encoding: utf-16-le (BOM)"), ("utf-16-le", "encoding: utf-16-le (detected)"),
    ("utf-32-be", "encoding: utf-32-be (detected)"),
])
def test_json_in_utf_16_or_utf_32_is_flattened(encode, reason):
    data = json.dumps({"title": WORD["zh"], "body": PROSE["zh"]}, ensure_ascii=False).encode(encode)
    result = run(data, "doc.json")
    assert (result.status, result.reason) == ("ok", reason)
    assert f"title: {WORD['zh']}" in text_of(result)


# -- e-mail -------------------------------------------------------------------------------------------

def _mail(body: bytes, content_type: str = "text/plain; charset=utf-8", cte: str = "8bit") -> bytes:
    return (b"From: ops@example.org\r\nTo: team@example.org\r\nSubject: Bericht\r\nMIME-Version: 1.0\r\n"
            + f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: {cte}\r\n\r\n".encode()
            + body)


def test_an_e_mail_saved_whole_as_utf_16_is_parsed():
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "ops@example.org", "team@example.org", "Größere Änderungen"
    msg.set_content(PROSE["de"])
    for encode, reason in (("utf-16", "encoding: utf-16-le (BOM)"),
                           ("utf-16-le", "encoding: utf-16-le (detected)")):
        result = run(msg.as_string().encode(encode), "bericht.eml")
        assert (result.status, result.reason, result.title) == ("ok", reason, "Größere Änderungen")
        assert WORD["de"] in text_of(result)


@pytest.mark.parametrize(("content_type", "lang", "encode", "reason"), [
    ("text/plain; charset=utf-8", "fr", "cp1252", "body encoding: windows-1252 (detected; declared utf-8)"),
    ("text/plain", "ru", "koi8-r", "body encoding: koi8-r (detected)"),
    ("text/plain; charset=x-mac-unknown", "ru", "cp1251", "body encoding: windows-1251 (detected)"),
    ("text/html; charset=us-ascii", "zh", "gb18030", "body encoding: gb18030 (detected; declared ascii)"),
])
def test_mail_parts_with_a_wrong_missing_or_unknown_charset_are_decoded_by_detection(
        content_type, lang, encode, reason):
    result = run(_mail(b"<p>" + PROSE[lang].encode(encode) + b"</p>" if "html" in content_type
                       else PROSE[lang].encode(encode), content_type), "mail.eml")
    assert (result.status, result.reason) == ("ok", reason)
    assert WORD[lang] in text_of(result)


def test_mail_parts_with_a_right_charset_need_no_reason_and_iso_2022_jp_is_read():
    assert run(_mail(PROSE["de"].encode("latin-1"), "text/plain; charset=iso-8859-1"), "a.eml").reason is None
    result = run(_mail(PROSE["ja"].encode("iso-2022-jp"), "text/plain; charset=iso-2022-jp", "7bit"), "b.eml")
    assert (result.status, result.reason) == ("ok", None)
    assert WORD["ja"] in text_of(result)


def test_the_attachments_of_an_e_mail_saved_whole_as_utf_16_are_its_members():
    msg = EmailMessage()
    msg["From"], msg["To"], msg["Subject"] = "ops@example.org", "team@example.org", "Bericht"
    msg.set_content(PROSE["de"])
    msg.add_attachment(PROSE["fr"], filename="notes.txt")
    expansion = expand("bericht.eml", io.BytesIO(msg.as_string().encode("utf-16")), Bounds(), Budget())
    members = {m.path: m.data for m in expansion.members}
    assert list(members) == ["attachments/notes.txt"]
    assert WORD["fr"] in members["attachments/notes.txt"].decode()
