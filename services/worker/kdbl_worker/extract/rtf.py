"""Rich Text Format via striprtf (pure Python, BSD): one Block per RTF paragraph (\\par)."""

from __future__ import annotations

from striprtf.striprtf import rtf_to_text

from kdbl_worker.extract.base import Block, Extraction, Source


def extract_rtf(source: Source) -> Extraction:
    data = source.stream.read()
    if data.lstrip()[:5] != b"{\\rtf":
        return Extraction.failed("not an RTF file (no {\\rtf header)")
    # RTF is 7-bit with escapes; latin-1 maps any stray 8-bit byte to one character losslessly.
    text = rtf_to_text(data.decode("latin-1"), errors="replace")
    return Extraction(blocks=[Block(line.strip()) for line in text.splitlines() if line.strip()])
