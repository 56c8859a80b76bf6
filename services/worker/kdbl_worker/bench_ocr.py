"""OCR speed and quality: `python -m kdbl_worker.bench_ocr [--pages N] [--dpi 200] [--pdf SCAN --truth TEXT]`.

Renders N A4 pages of known, document-like text (seeded: words, numbers, dates, amounts, punctuation)
with the fonts this machine has (DejaVu Sans, Serif, Mono; Pillow's own font when none), every fourth
page with salt-and-pepper noise, a slight blur and a 1.5 degree skew like a cheap scan, reads them
with the worker's OCR engine (extract/ocr.py, one thread) and reports pages/s and the character error
rate: Levenshtein distance over the reference length, both with whitespace normalised (runs of
spaces/newlines become one space, so layout differences are free but a lost word space counts).
`--pdf` also reads the first page of a real scanned PDF the way the PDF extractor does and reports its
CER against `--truth` (the page's text, typed by a person).

The rendering and `cer` are what tests/unit/test_ocr.py uses for its pages. Not a test: the numbers
depend on the machine; write them down with its load (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import textwrap
import time
from collections.abc import Iterator

from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = "/usr/share/fonts/truetype/dejavu"
FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf")
_WORDS = (
    "the quarterly report shows revenue across all regions; invoice number was paid on time. Contract "
    "terms require written notice within thirty days, and the supplier (Acme GmbH) agreed to deliver spare "
    "parts to the Hamburg warehouse. Please review section before signing: liability is capped per incident. "
    "Meeting minutes: attendees discussed budget, hiring plans and the migration of legacy servers to the "
    "new data centre in Frankfurt."
).split()


def sentence_text(rng: random.Random, words: int) -> str:
    """Document-like text: the vocabulary above with numbers, dates and amounts mixed in."""
    out = []
    for _ in range(words):
        roll = rng.random()
        if roll < 0.06:
            out.append(f"{rng.randint(1, 9999):,}")
        elif roll < 0.08:
            out.append(f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
        elif roll < 0.09:
            out.append(f"EUR {rng.randint(100, 99999):,}.{rng.randint(0, 99):02d}")
        else:
            out.append(rng.choice(_WORDS))
    return " ".join(out)


def font_paths() -> list[str]:
    """The TrueType fonts available here (none on a machine without DejaVu: Pillow's font is used)."""
    return [path for name in FONTS if os.path.isfile(path := os.path.join(FONT_DIR, name))]


def _font(path: str | None, size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    if path is not None:
        return ImageFont.truetype(path, size)
    return ImageFont.load_default(size=size)


def render(text: str, *, font: str | None = None, dpi: int = 200, point: float = 11.0, width_in: float = 8.27,
           height_in: float | None = 11.69, margin_in: float = 0.8, noisy: bool = False, skew: float = 0.0,
           ) -> tuple[Image.Image, str]:
    """Typeset `text` in a grey page image; returns the image and the text that fitted (lines joined by
    newlines). `height_in=None` sizes the page to the text (small images for tests)."""
    size = round(point / 72 * dpi)
    face = _font(font, size)
    width, margin = round(width_in * dpi), round(margin_in * dpi)
    average = face.getlength("abcdefghijklmnopqrstuvwxyz ") / 27
    lines = textwrap.wrap(text, max(10, int((width - 2 * margin) / average)))
    step = round(size * 1.45)
    height = round(height_in * dpi) if height_in else 2 * margin + step * len(lines)
    fitted = lines[: max(1, (height - 2 * margin) // step)]
    page = Image.new("L", (width, height), 255)
    draw = ImageDraw.Draw(page)
    for number, line in enumerate(fitted):
        draw.text((margin, margin + number * step), line, font=face, fill=0)
    if noisy:
        rng = random.Random(width * height)
        pixels = page.load()
        for _ in range(width * height // 250):
            pixels[rng.randrange(width), rng.randrange(height)] = rng.choice((0, 255))
        page = page.filter(ImageFilter.GaussianBlur(0.6))
    if skew:
        page = page.rotate(skew, expand=True, fillcolor=255, resample=Image.Resampling.BICUBIC)
    return page, "\n".join(fitted)


def levenshtein(a: str, b: str) -> int:
    """Edit distance, bit-parallel (Myers 1999 / Hyyrö) over Python integers: a 3,000-character page
    pair in a few milliseconds instead of the ~5 s of the row-by-row table."""
    if len(a) < len(b):
        a, b = b, a
    m = len(b)
    if m == 0:
        return len(a)
    peq: dict[str, int] = {}
    for i, ch in enumerate(b):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    mask, last = (1 << m) - 1, 1 << (m - 1)
    pv, mv, score = mask, 0, m
    for ch in a:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | ~(xh | pv)
        mh = pv & xh
        if ph & last:
            score += 1
        elif mh & last:
            score -= 1
        ph = (ph << 1) | 1
        mh <<= 1
        pv = (mh | ~(xv | ph)) & mask
        mv = (ph & xv) & mask
    return score


def normalise(text: str) -> str:
    return " ".join(text.split())


def cer(reference: str, hypothesis: str) -> float:
    """Character error rate with whitespace normalised (0.0 = exact)."""
    ref, hyp = normalise(reference), normalise(hypothesis)
    return levenshtein(ref, hyp) / max(1, len(ref))


def pages(count: int, dpi: int, seed: int = 14) -> Iterator[tuple[str, Image.Image, str]]:
    """(label, image, reference) for `count` A4 pages: fonts in turn, every fourth page noisy and skewed."""
    rng = random.Random(seed)
    fonts = font_paths() or [None]
    for index in range(count):
        font = fonts[index % len(fonts)]
        noisy = index % 4 == 3
        image, reference = render(sentence_text(rng, 450), font=font, dpi=dpi, noisy=noisy,
                                  skew=1.5 if noisy else 0.0)
        label = f"{os.path.basename(font) if font else 'Pillow default'}{' noisy+skew' if noisy else ''}"
        yield label, image, reference


def run(count: int, dpi: int, pdf: str | None = None, truth: str | None = None) -> dict:
    from kdbl_worker.extract import ocr

    engine = ocr.engine()
    if engine is None:
        raise SystemExit(f"bench_ocr: {ocr.NOT_INSTALLED}")
    rows, spent = [], 0.0
    for label, image, reference in pages(count, dpi):
        start = time.perf_counter()
        text = engine.read(image)
        took = time.perf_counter() - start
        spent += took
        rows.append({"page": label, "seconds": round(took, 3), "cer": round(cer(reference, text), 5),
                     "chars": len(normalise(reference))})
    result: dict = {
        "pages": count, "dpi": dpi, "seconds": round(spent, 2),
        "pages_per_s": round(count / spent, 3) if spent else None,
        "cer_mean": round(sum(r["cer"] for r in rows) / max(1, len(rows)), 5),
        "cer_max": max((r["cer"] for r in rows), default=None), "per_page": rows,
    }
    if pdf:
        result["scan"] = _scan(pdf, truth or "", engine)
    return result


def _scan(path: str, truth: str, engine: object) -> dict:
    import pypdfium2 as pdfium

    from kdbl_worker.extract.pdf import _ocr_page

    doc = pdfium.PdfDocument(path)
    try:
        start = time.perf_counter()
        text = _ocr_page(doc, 0, engine)  # type: ignore[arg-type]
        took = time.perf_counter() - start
    finally:
        doc.close()
    return {"file": os.path.basename(path), "seconds": round(took, 3), "cer": round(cer(truth, text), 5),
            "text": normalise(text)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdbl_worker.bench_ocr",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--pages", type=int, default=8, help="rendered A4 pages (default 8)")
    parser.add_argument("--dpi", type=int, default=200)
    parser.add_argument("--pdf", help="a real scanned PDF: its first page is read too")
    parser.add_argument("--truth", help="the text of that page, for its CER")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.pages, args.dpi, args.pdf, args.truth)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    for row in result["per_page"]:
        print(f"  {row['page']:<28} {row['seconds']:6.2f} s  CER {row['cer'] * 100:5.2f} %  "
              f"({row['chars']} chars)")
    print(f"{result['pages']} pages at {result['dpi']} dpi: {result['pages_per_s']} pages/s, "
          f"CER mean {result['cer_mean'] * 100:.2f} %, max {result['cer_max'] * 100:.2f} %")
    if "scan" in result:
        scan = result["scan"]
        print(f"scan {scan['file']}: {scan['seconds']} s, CER {scan['cer'] * 100:.2f} %: "
              f"{scan['text'][:120]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
