"""CSV/TSV via the stdlib csv module: rows as tab-separated lines, in Blocks of ROWS_PER_BLOCK.

The delimiter is sniffed from the first lines (, ; tab |). The header row is repeated
at the top of every block so that a chunk on its own still says what the columns are.
"""

from __future__ import annotations

import csv
import io

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import decode

ROWS_PER_BLOCK = 50
MAX_ROWS = 1_000_000
_DELIMITERS = ",;\t|"
_SNIFF_CHARS = 4096  # the sniffer is quadratic on some inputs: keep the sample small


def _dialect(sample: str, default: str) -> type[csv.Dialect] | csv.Dialect:
    try:
        return csv.Sniffer().sniff(sample, delimiters=_DELIMITERS)
    except csv.Error:
        return csv.excel_tab if default == "\t" else csv.excel


def _line(row: list[str]) -> str:
    return "\t".join(" ".join(cell.split()) for cell in row).rstrip("\t")


def extract_csv(source: Source, *, max_rows: int = MAX_ROWS) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    text, partial = decoded.text, decoded.lossy
    problems = [decoded.note] if decoded.note else []  # an encoding note alone leaves the status ok
    default = "\t" if source.name.lower().endswith((".tsv", ".tab")) else ","
    sample = text[:_SNIFF_CHARS]
    sample = sample[: sample.rfind("\n") + 1] or sample  # whole lines only: a cut line misleads the sniffer
    reader = csv.reader(io.StringIO(text, newline=""), _dialect(sample, default))
    blocks: list[Block] = []
    header: str | None = None
    lines: list[str] = []
    try:
        for row in reader:
            if reader.line_num > max_rows:
                problems.append(f"row cap reached ({max_rows} lines); the rest skipped")
                partial = True
                break
            line = _line(row)
            if not line.strip():
                continue
            if header is None:
                header = line
                continue
            lines.append(line)
            if len(lines) == ROWS_PER_BLOCK:
                blocks.append(Block("\n".join([header, *lines])))
                lines = []
    except csv.Error as exc:  # e.g. a field over csv.field_size_limit() (128 KiB)
        problems.append(f"CSV parse error at line {reader.line_num}: {exc}")
        partial = True
    if lines or (header is not None and not blocks):
        blocks.append(Block("\n".join([header or "", *lines])))
    if partial and not blocks:
        return Extraction.failed("; ".join(problems))
    return Extraction(
        blocks=blocks, status="partial" if partial else "ok", reason="; ".join(problems) or None
    )
