"""OCR of images and scanned PDF pages (extract/ocr.py, extract/image.py, extract/pdf.py).

Every page is rendered here from known text (kdbl_worker.bench_ocr.render: DejaVu when the machine has
it, else Pillow's own font), small (a few lines, 200 dpi) so the file runs in a few seconds.

CER thresholds: on clean rendered pages Tesseract 5 measured 0.00-0.03 % (docs/benchmarks.md); 2 % allows
an engine update to confuse a character or two in these ~200-character samples without letting a
broken pipeline through (a lost line is >30 %, RapidOCR's lost word spaces were 13 %). The noisy, skewed
page measured 0.10-0.35 %: 5 %.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pypdfium2 as pdfium
import pytest
from helpers import make_pdf, pdf_text_page
from PIL import Image

from kdbl_worker import sandbox
from kdbl_worker.bench_ocr import cer, render
from kdbl_worker.extract import Source, extract, ocr
from kdbl_worker.pipeline import ocr_enabled

LINES = ("The okapi survey of 2024 counted 1,482 animals in the Ituri forest; funding of EUR 12,500 was "
         "approved on March 3rd.")
PAGES = ("Page one lists the zeppelin hangar inventory.", "Page two records the quokka census results.",
         "Page three closes the annual lighthouse report.")
CLEAN, NOISY = 0.02, 0.05


def _font() -> str | None:
    path = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
    return path if os.path.isfile(path) else None


def image_of(text: str, **kw) -> tuple[Image.Image, str]:
    return render(text, font=_font(), dpi=200, width_in=6.0, height_in=None, margin_in=0.3, **kw)


def encoded(image: Image.Image, fmt: str, **kw) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kw)
    return out.getvalue()


def run(data: bytes, name: str, **kw):
    return extract(Source(io.BytesIO(data), name, len(data), **kw))


def text_of(result) -> str:
    return "\n".join(b.text for b in result.blocks)


def image_pdf(*texts: str) -> bytes:
    """A PDF whose pages are only images of `texts` (what a scanner writes)."""
    images = [image_of(t)[0].convert("RGB") for t in texts]
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=200.0, save_all=True, append_images=images[1:])
    return out.getvalue()


def merged(*parts: bytes) -> bytes:
    doc = pdfium.PdfDocument.new()
    for part in parts:
        src = pdfium.PdfDocument(part)
        doc.import_pages(src)
        src.close()
    out = io.BytesIO()
    doc.save(out)
    doc.close()
    return out.getvalue()


# --- images ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, fmt, options", [
    ("scan.png", "PNG", {}),
    ("photo.jpg", "JPEG", {"quality": 80}),
    ("page.webp", "WEBP", {"quality": 80}),
    ("legacy.bmp", "BMP", {}),
    ("fax.gif", "GIF", {}),
])
def test_an_image_extracts_to_the_text_rendered_in_it(name, fmt, options):
    image, reference = image_of(LINES)
    result = run(encoded(image, fmt, **options), name)
    assert result.status == "ok", result.reason
    assert result.content_type.startswith("image/")
    assert cer(reference, text_of(result)) < CLEAN, text_of(result)


def test_a_multi_page_tiff_gives_one_block_per_page_with_its_page_number():
    frames = [image_of(text)[0] for text in PAGES]
    data = encoded(frames[0], "TIFF", save_all=True, append_images=frames[1:], compression="tiff_deflate")
    result = run(data, "fax.tiff")
    assert result.status == "ok", result.reason
    assert [b.page_no for b in result.blocks] == [1, 2, 3]
    for block, text in zip(result.blocks, PAGES, strict=True):
        assert cer(text, block.text) < CLEAN, block.text


def test_a_noisy_skewed_scan_reads_within_5_percent():
    image, reference = image_of(LINES + " " + LINES, noisy=True, skew=1.5)
    result = run(encoded(image, "PNG"), "skewed.png")
    assert result.status == "ok"
    assert cer(reference, text_of(result)) < NOISY, text_of(result)


@pytest.mark.parametrize("turn", [90, 180])
def test_a_page_scanned_turned_is_read_upright(turn):
    image, reference = image_of(" ".join([LINES] * 3))
    result = run(encoded(image.rotate(turn, expand=True, fillcolor=255), "PNG"), "turned.png")
    assert result.status == "ok"
    assert cer(reference, text_of(result)) < CLEAN, text_of(result)


def test_a_transparent_png_with_black_text_is_read_on_white():
    image, reference = image_of(LINES)
    rgba = Image.new("RGBA", image.size, (0, 0, 0, 0))
    rgba.putalpha(image.point(lambda v: 255 - v))  # black text, transparent paper
    result = run(encoded(rgba, "PNG"), "overlay.png")
    assert cer(reference, text_of(result)) < CLEAN, text_of(result)


def test_an_image_past_the_pixel_bound_fails_with_a_reason_before_decoding():
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 40_000, 40_000, 8, 0, 0, 0, 0))
    data = b"\x89PNG\r\n\x1a\n" + header + chunk(b"IEND", b"")
    result = run(data, "huge.png")
    assert result.status == "failed" and "image too large to OCR" in result.reason


def test_a_corrupt_image_fails_with_a_reason():
    result = run(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20, "broken.png")
    assert result.status == "failed" and result.reason.startswith("unreadable image")


def test_a_blank_image_is_skipped_as_no_text():
    result = run(encoded(Image.new("L", (400, 200), 255), "PNG"), "blank.png")
    assert (result.status, result.reason) == ("skipped", "no text found by OCR")


# --- PDF pages without a text layer --------------------------------------------------------------


def test_a_pdf_image_only_page_gets_its_text_with_its_page_number():
    data = merged(make_pdf([pdf_text_page("Cover sheet of the maintenance contract")]), image_pdf(PAGES[0]))
    result = run(data, "contract.pdf")
    assert result.status == "ok", result.reason
    assert [b.page_no for b in result.blocks] == [1, 2]
    assert result.blocks[0].text == "Cover sheet of the maintenance contract"
    assert cer(PAGES[0], result.blocks[1].text) < CLEAN, result.blocks[1].text


def test_ocr_text_gets_chunks_with_the_page_number_and_character_locators():
    data = merged(make_pdf([pdf_text_page("Cover sheet of the maintenance contract")]), image_pdf(PAGES[1]))
    outcome = sandbox.extract_and_chunk("contract.pdf", len(data), io.BytesIO(data),
                                        sandbox.Limits(chunk_target=100, chunk_max=200))
    assert outcome.status == "ok", outcome.reason
    by_page = {c[4]: c for c in outcome.chunks}
    assert set(by_page) == {1, 2}
    _, text, start, end, *_ = by_page[2]
    assert "quokka" in text and 0 < start < end == outcome.text_chars


def test_pages_past_the_ocr_page_limit_stay_unread_and_the_pdf_is_partial():
    data = image_pdf(*PAGES)
    result = run(data, "scan.pdf", ocr_max_pages=2)
    assert result.status == "partial"
    assert [b.page_no for b in result.blocks] == [1, 2]
    assert "OCR page limit reached: 2 scanned pages read" in result.reason
    assert "KDBL_OCR_MAX_PAGES" in result.reason and "1 of 3 pages have no text layer" in result.reason


def test_tiff_pages_past_the_ocr_page_limit_stay_unread_and_the_file_is_partial():
    frames = [image_of(text)[0] for text in PAGES]
    data = encoded(frames[0], "TIFF", save_all=True, append_images=frames[1:])
    result = run(data, "fax.tif", ocr_max_pages=1)
    assert result.status == "partial" and [b.page_no for b in result.blocks] == [1]
    assert result.reason == "OCR page limit reached: read 1 of 3 pages (KDBL_OCR_MAX_PAGES)"


def test_ocr_stops_when_its_time_budget_is_spent_and_keeps_the_pages_read():
    result = run(image_pdf(*PAGES), "slow.pdf", ocr_budget_s=0.0)
    assert result.status == "partial" and [b.page_no for b in result.blocks] == [1]
    assert "OCR time budget spent: 1 scanned pages read" in result.reason


# --- the per-source switch and a missing engine ----------------------------------------------------


def test_with_ocr_off_an_image_is_skipped_with_what_to_change():
    image, _ = image_of(LINES)
    result = run(encoded(image, "PNG"), "scan.png", ocr=False)
    assert (result.status, result.blocks) == ("skipped", [])
    assert result.reason == ocr.OFF and "ocr: true" in result.reason


def test_with_ocr_off_a_scanned_pdf_is_skipped_and_a_mixed_one_partial_saying_so():
    scanned = run(image_pdf(PAGES[0]), "scan.pdf", ocr=False)
    assert scanned.status == "skipped" and scanned.reason == f"no text layer (scanned?); {ocr.OFF}"
    mixed = run(merged(make_pdf([pdf_text_page("Cover sheet")]), image_pdf(PAGES[0])), "mixed.pdf", ocr=False)
    assert mixed.status == "partial" and [b.page_no for b in mixed.blocks] == [1]
    assert mixed.reason == f"1 of 2 pages have no text layer (scanned?), first: page 2; {ocr.OFF}"


def test_a_task_of_a_source_with_ocr_off_reaches_the_sandbox_child():
    image, reference = image_of(LINES)
    data = encoded(image, "PNG")
    box = sandbox.Sandbox(processes=1, limits=sandbox.Limits())
    try:
        tasks = [sandbox.Task("off", "a.png", len(data), data=data, ocr=False),
                 sandbox.Task("on", "b.png", len(data), data=data)]
        results = {task.ref: outcome for task, outcome in box.run(tasks)}
    finally:
        box.close()
    assert (results["off"].status, results["off"].reason) == ("skipped", ocr.OFF)
    assert results["on"].status == "ok" and cer(reference, results["on"].chunks[0][1]) < CLEAN


def test_the_source_config_key_ocr_false_turns_ocr_off_and_anything_else_leaves_it_on():
    assert ocr_enabled({"root": "/data"}) is True
    assert ocr_enabled({"ocr": True}) is True
    assert ocr_enabled({"ocr": False}) is False


def test_kdbl_control_source_add_no_ocr_and_the_operator_spec_ocr_false_store_ocr_false():
    from kdbl_control.cli import build_parser
    from kdbl_control.cli_source import source_config
    from kdbl_operator import desired

    args = build_parser().parse_args(["source", "add", "--tenant", "t", "--path", "/data", "--no-ocr"])
    assert source_config(args)["ocr"] is False
    body = {"apiVersion": "kdbl.io/v1alpha1", "kind": "Source", "metadata": {"name": "s", "namespace": "n"},
            "spec": {"tenantRef": {"name": "acme"}, "protocol": "fs", "connection": {"path": "/d"},
                     "ocr": False}}
    assert desired.source(body).config["ocr"] is False
    body["spec"]["ocr"] = True
    assert "ocr" not in desired.source(body).config


CHILD = """
import socket, sys
def refuse(*args, **kwargs):
    raise OSError("network disabled in this test")
socket.socket.connect = socket.socket.connect_ex = refuse
socket.create_connection = socket.getaddrinfo = refuse
sys.modules.update({name: None for name in sys.argv[1:]})  # an import of these fails
from kdbl_worker.bench_ocr import render
from kdbl_worker.extract import ocr
engine = ocr.engine()
print("engine:", "none" if engine is None else "loaded")
if engine is not None:
    print("text:", engine.read(render("Offline engines read quietly", height_in=None)[0]))
"""


def _child(*hidden: str) -> str:
    done = subprocess.run([sys.executable, "-c", CHILD, *hidden], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_engine_loads_and_reads_with_the_network_refused():
    out = _child()
    assert "engine: loaded" in out and "text: Offline engines read quietly" in out


def test_without_the_ocr_extra_images_are_skipped_saying_how_to_install_it():
    assert "engine: none" in _child("tesserocr")
    image, _ = image_of(LINES)
    data = encoded(image, "PNG")
    code = ("import io, sys; sys.modules['tesserocr'] = None\n"
            "from kdbl_worker.extract import Source, extract\n"
            f"data = {data!r}\n"
            "r = extract(Source(io.BytesIO(data), 'a.png', len(data)))\n"
            "print(r.status, '|', r.reason)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"skipped | {ocr.NOT_INSTALLED}", done.stderr
    assert "pip install 'kdbl-context-lake[ocr]'" in ocr.NOT_INSTALLED


# --- scripts: read with the model for the script, or marked partial; never garbage as ok ----------

SCRIPTS = Path(__file__).resolve().parents[1] / "data" / "ocr"
JAPANESE = "東京の図書館は毎朝九時に開館します。"


def test_an_image_of_japanese_text_is_read_with_the_japanese_model():
    result = run((SCRIPTS / "ja.png").read_bytes(), "notice.png")
    assert result.status == "ok", result.reason
    assert text_of(result).splitlines()[0] == JAPANESE
    assert cer(text_of(result), (SCRIPTS / "ja.txt").read_text().strip()) <= CLEAN


def test_an_image_of_chinese_text_without_a_chinese_model_keeps_no_text_and_is_partial_naming_the_script():
    """The English model reads it as confident-looking Latin garbage ("ICRABiEBAS FARA."); no wheel
    ships a Chinese model, so the page keeps nothing and the file says why."""
    result = run((SCRIPTS / "zh.png").read_bytes(), "notice.png")
    assert (result.status, result.blocks) == ("partial", [])
    assert "Han script" in result.reason and "no OCR model for Chinese" in result.reason


def test_a_scanned_pdf_page_in_chinese_makes_the_pdf_partial_and_its_other_pages_keep_their_text():
    chinese = Image.open(SCRIPTS / "zh.png").convert("RGB")
    english = image_of(PAGES[0])[0].convert("RGB")
    out = io.BytesIO()
    english.save(out, "PDF", resolution=200.0, save_all=True, append_images=[chinese])
    result = run(out.getvalue(), "scans.pdf")
    assert result.status == "partial"
    assert [b.page_no for b in result.blocks] == [1]
    assert "1 of 2 scanned pages left unread, first: page 2: text in Han script" in result.reason
