"""Bytes to text for every text-based extractor: which encoding, and whether the bytes are text at all.

Order, cheapest and surest first:
1. a byte-order mark (UTF-8, UTF-16 LE/BE, UTF-32 LE/BE) decides;
2. NUL bytes in the first 8 KiB: UTF-16/UTF-32 without a BOM when the NULs fall where a wide encoding puts
   them (the high bytes of ASCII characters: odd offsets for LE, even for BE) and the head decodes to text
   without control characters; any other NUL is binary junk and refused;
3. more than 5% control characters in the first 8 KiB: refused as binary;
4. strict UTF-8 over the whole file: the common case and the fast path (no detector runs);
5. not UTF-8: mostly UTF-8 with a few bad bytes stays UTF-8 (bytes replaced); else the charset the format
   declares (MIME part, XML declaration, HTML meta) when it decodes cleanly; else charset-normalizer on a
   bounded prefix (64 KiB, cut at a line end) picks the legacy encoding (windows-1252, cp1251, koi8-r,
   shift_jis, gb18030, ...) and the whole file is decoded with it.

Where charset-normalizer ranks look-alikes equally (windows-1250 vs windows-1252 on French or German text,
which differ only in a few letters), the more common encoding wins (`_PREFERRED`).

The result says what the status reason needs: nothing for plain UTF-8, `encoding: utf-16-le (BOM)` or
`encoding: windows-1252 (detected)` otherwise; `lossy` only when bytes had to be replaced (status partial).

Measured (2 shared cores, timeit, old decode_text vs this in one run): UTF-8 prose 1.2 MB 1.88 -> 1.78 ms,
11.6 MB 21.7 -> 21.4 ms; ASCII 10 MB 0.50 -> 0.35 ms (the control-character count is a bytes.translate now).
charset-normalizer takes 4-5 ms on the 64 KiB prefix whatever the file's size; on a whole 10 MB file it took
270-320 ms (windows-1251/-1252) and 790 ms (18 MB shift_jis), and picked windows-1250 for windows-1252 text.
A whole 10 MB windows-1251 file decodes in 17 ms.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from dataclasses import dataclass

SNIFF_BYTES = 8192  # NUL and control-character checks look at this much
DETECT_BYTES = 65536  # charset-normalizer sees at most this prefix
_CONTROL_SHARE = 0.05
# bytes that are not control characters (tab, LF, VT, FF, CR and everything from space up)
_TEXT_BYTES = bytes(range(9, 14)) + bytes(range(32, 256))
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0e-\x1f]")
_WIDE_JUNK = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_BOMS = (  # UTF-32 LE before UTF-16 LE: its BOM starts with the same two bytes
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# Among equally ranked detector matches (and the encodings that decode the prefix identically), the first
# of these wins; supersets before their subsets so that a rare character later in the file still decodes.
_PREFERRED = ("utf_8", "cp1252", "cp1251", "koi8_r", "gb18030", "cp932", "euc_jis_2004", "big5hkscs", "cp949",
              "cp1250", "iso8859_2", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258")
_LABELS = {"cp932": "shift_jis", "euc_jis_2004": "euc-jp", "cp949": "euc-kr", "big5hkscs": "big5"}
_NOT_TEXT = ("Cn", "Co", "Cs")  # unassigned, private use, surrogate
_SEVEN_BIT = ("iso2022", "hz")  # stateful 7-bit encodings: escape sequences in ASCII bytes
_NOT_CHARSETS = {"unicode-escape", "raw-unicode-escape", "idna", "punycode", "utf-7"}


@dataclass(frozen=True, slots=True)
class Decoded:
    """Text and what the file's status should say about its encoding.

    `text` is None when the bytes are not text (then `note` says why). `note` is None for plain UTF-8.
    `lossy`: some bytes did not decode and were replaced with U+FFFD (the file's status is partial).
    """

    text: str | None
    note: str | None = None
    lossy: bool = False
    encoding: str = "utf-8"


def label(codec: str) -> str:
    """A codec's common name: windows-1252, iso-8859-1, utf-16-le, koi8-r, shift_jis, gb18030."""
    name = codecs.lookup(codec).name
    if name in _LABELS:
        return _LABELS[name]
    if re.fullmatch(r"cp125\d", name):
        return "windows-" + name[2:]
    if name.startswith("iso8859-"):
        return "iso-8859-" + name[8:]
    return name if name == "shift_jis" else name.replace("_", "-")


def text_codec(name: str | None) -> str | None:
    """The Python codec for a declared charset name, or None when unknown or not a text encoding."""
    if not name:
        return None
    try:
        info = codecs.lookup(name.strip().strip("\"'"))
    except (LookupError, ValueError):
        return None
    if not getattr(info, "_is_text_encoding", True) or info.name in _NOT_CHARSETS:
        return None
    return info.name


def decode(data: bytes, declared: str | None = None) -> Decoded:
    """Decode a file's bytes; `declared` is the charset the format itself names, if any. Never raises."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            decoded = _checked(_whole(data[len(bom):], codec, "BOM"))
            if codec == "utf-8" and not decoded.lossy:  # a UTF-8 BOM is still plain UTF-8
                return Decoded(decoded.text, None if decoded.text is not None else decoded.note)
            return decoded
    codec = text_codec(declared)
    if codec and codec.startswith(_SEVEN_BIT) and data.isascii():  # ISO-2022-JP mail: ASCII bytes, not UTF-8
        try:
            return Decoded(data.decode(codec), f"encoding: {label(codec)} (declared)", encoding=codec)
        except UnicodeDecodeError:
            pass
    head = data[:SNIFF_BYTES]
    if b"\x00" in head:
        wide = _wide(head)
        if wide is None:
            return Decoded(None, "binary content (NUL bytes) in a text file")
        return _whole(data, wide, "detected")
    if head and len(head.translate(None, _TEXT_BYTES)) / len(head) > _CONTROL_SHARE:
        return Decoded(None, "binary content (control characters) in a text file")
    try:
        return Decoded(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        first_bad = exc.start
    return _legacy(data, first_bad, codec)


def _whole(data: bytes, codec: str, how: str, declared: str | None = None) -> Decoded:
    """Decode all of `data` with `codec`; bytes that do not decode are replaced and make it lossy."""
    note = f"encoding: {label(codec)} ({how})"
    if declared and how == "detected" and label(declared) != label(codec):
        note = f"encoding: {label(codec)} (detected; declared {label(declared)})"
    try:
        return Decoded(data.decode(codec), note, encoding=codec)
    except UnicodeDecodeError as exc:
        return Decoded(data.decode(codec, errors="replace"),
                       f"{note}; undecodable bytes replaced (first at offset {exc.start})", True, codec)


def _checked(decoded: Decoded) -> Decoded:
    """Refuse what a BOM called text when its head decodes to control characters."""
    if decoded.text is None:
        return decoded
    head = decoded.text[:SNIFF_BYTES // 2]
    if head and len(_CONTROL_CHARS.findall(head)) / len(head) > _CONTROL_SHARE:
        return Decoded(None, "binary content (control characters) in a text file")
    return decoded


def _wide(head: bytes) -> str | None:
    """UTF-32/UTF-16 (LE or BE) when the NULs of `head` fit one and its head decodes to clean text."""
    quad = len(head) // 4 * 4
    z = [head[i:quad:4].count(0) for i in range(4)]
    groups = quad // 4
    candidates = []
    if groups and z[3] == groups and z[2] >= groups * 0.9:  # code points stay far below U+1000000
        candidates.append("utf-32-le")
    if groups and z[0] == groups and z[1] >= groups * 0.9:
        candidates.append("utf-32-be")
    pair = len(head) // 2 * 2
    even, odd = head[0:pair:2].count(0), head[1:pair:2].count(0)
    # ASCII in UTF-16 LE has its NUL at odd offsets (BE: even); CJK text has few NULs on either side
    if odd >= even:
        candidates.append("utf-16-le")
    if even >= odd:
        candidates.append("utf-16-be")
    for codec in candidates:
        unit = 4 if codec.startswith("utf-32") else 2
        sample = head[: len(head) // unit * unit]
        text = None
        for trim in (0, 2):  # the sniff window may cut a surrogate pair in two
            try:
                text = sample[: len(sample) - trim].decode(codec)
                break
            except UnicodeDecodeError:
                continue
        if text and _plausible(text):
            return codec
    return None


def _plausible(text: str) -> bool:
    """Binary read as UTF-16/32 gives C0/C1 controls (from its NUL bytes), surrogates, private-use and
    unassigned code points (a quarter of random 16-bit values); text in a wide encoding holds none."""
    if _WIDE_JUNK.search(text):
        return False
    return not any(unicodedata.category(char) in _NOT_TEXT for char in set(text) if not char.isascii())


def _legacy(data: bytes, first_bad: int, declared: str | None) -> Decoded:
    """Not UTF-8: a few bad bytes in UTF-8, the declared charset, or the detected one."""
    # from the first bad byte on, a window: valid multi-byte sequences dominate in UTF-8 with a few broken
    # bytes; in a legacy encoding nearly every non-ASCII byte is bad (bounded: 1.5 ms, not 50 ms per 10 MB)
    window = data[first_bad:first_bad + DETECT_BYTES].decode("utf-8", errors="replace")
    bad = window.count("\ufffd")
    non_ascii = len(window) - len(window.encode("ascii", errors="ignore")) - bad
    if non_ascii >= 4 * bad:
        return _broken_utf8(data, first_bad)
    if declared and declared not in ("utf-8", "ascii"):
        try:
            text = data.decode(declared)
            return Decoded(text, f"encoding: {label(declared)} (declared)", encoding=declared)
        except UnicodeDecodeError:
            pass
    codec = detect(data[:DETECT_BYTES])
    if codec is None:
        return _broken_utf8(data, first_bad)
    return _whole(data, codec, "detected", declared)


def _broken_utf8(data: bytes, first_bad: int) -> Decoded:
    note = f"not valid UTF-8 (first bad byte at offset {first_bad}); undecodable bytes replaced"
    return Decoded(data.decode("utf-8", errors="replace"), note, True)


def detect(prefix: bytes) -> str | None:
    """charset-normalizer's pick for a prefix of a file (whole lines only), the common one among equals."""
    from charset_normalizer import from_bytes  # only files that are not UTF-8 pay its import (~20 ms)

    if len(prefix) == DETECT_BYTES:
        end = prefix.rfind(b"\n")
        if end > DETECT_BYTES // 2:  # a line end is a character boundary in every ASCII-compatible encoding
            prefix = prefix[: end + 1]
    matches = list(from_bytes(prefix))
    if not matches:
        return None
    best = matches[0]
    equals = [m for m in matches if m.chaos <= best.chaos + 0.01 and m.coherence >= best.coherence - 0.01]
    for preferred in _PREFERRED:
        for match in equals:
            if preferred in (match.encoding, *match.could_be_from_charset):
                return preferred
    return best.encoding
