"""Excel .xlsx/.xlsm via openpyxl (read-only, cached values): rows as lines, cells joined by " | ".

Each sheet becomes Blocks of up to ROWS_PER_BLOCK non-empty rows, each starting with
"Sheet: <name>", page_no = the sheet's position (1-based). Rows are streamed; the
declared sheet dimensions are ignored (they can claim a million empty rows), and a
cell cap bounds the work on a huge workbook.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
import warnings
import zipfile

import openpyxl
from openpyxl.utils.exceptions import InvalidFileException

from kdbl_worker.extract import authors
from kdbl_worker.extract.archive import LegacyBinary, PackageError, guarded_ooxml
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.tables import row_text

ROWS_PER_BLOCK = 50
MAX_CELLS = 2_000_000


def format_value(value: object) -> str:
    """A cell value as text: integral floats without '.0', dates in ISO form, text on one line."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    return " ".join(str(value).split())


def row_line(values) -> str:
    """A row's values in one line, cells joined by " | " like every format's tables (extract/tables.py)."""
    return row_text(format_value(v) for v in values)


def sheet_blocks(name: str, rows: Iterable[Sequence[object]], page_no: int,
                 budget: int) -> tuple[list[Block], int]:
    """Blocks for one sheet's rows of cell values and the number of cells read (stops once `budget` cells
    are used); the .xls reader lays its sheets out with this too, so both look alike to an agent."""
    blocks: list[Block] = []
    lines: list[str] = []
    used = 0
    header = f"Sheet: {name}"
    for values in rows:
        line = row_line(values)
        if not line.strip():
            continue
        used += len(values)
        lines.append(line)
        if len(lines) == ROWS_PER_BLOCK:
            blocks.append(Block("\n".join([header, *lines]), page_no=page_no))
            lines = []
        if used >= budget:
            break
    if lines:
        blocks.append(Block("\n".join([header, *lines]), page_no=page_no))
    return blocks, used


def extract_xlsx(source: Source, *, max_cells: int = MAX_CELLS) -> Extraction:
    try:
        guarded_ooxml(source.stream, ".xls")
    except LegacyBinary:  # a .xls file saved under a .xlsx name
        from kdbl_worker.extract.xls import extract_xls

        return extract_xls(source)
    except PackageError as exc:
        return Extraction.failed(str(exc))
    with warnings.catch_warnings():
        # openpyxl warns about workbook features it drops (data validation, conditional
        # formatting extensions, ...); they carry no text, so they are not worth a log line.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"openpyxl\.")
        try:
            workbook = openpyxl.load_workbook(
                source.stream, read_only=True, data_only=True, keep_links=False, rich_text=False
            )
        except (InvalidFileException, zipfile.BadZipFile, KeyError) as exc:
            return Extraction.failed(f"not an Excel workbook: {exc}")
        try:
            blocks: list[Block] = []
            budget = max_cells
            capped_at = None
            for index, name in enumerate(workbook.sheetnames, start=1):
                sheet = workbook[name]
                if not hasattr(sheet, "iter_rows"):
                    continue  # chartsheet
                if hasattr(sheet, "reset_dimensions"):
                    sheet.reset_dimensions()
                blocks_of_sheet, used = sheet_blocks(name, sheet.iter_rows(values_only=True), index, budget)
                blocks.extend(blocks_of_sheet)
                budget -= used
                if budget <= 0:
                    capped_at = name
                    break
            title = (workbook.properties.title or "").strip() or None
            by = authors.names(workbook.properties.creator)
        finally:
            workbook.close()
    if capped_at is not None:
        reason = f"cell cap reached ({max_cells} cells) in sheet {capped_at!r}; later rows and sheets skipped"
        return Extraction(blocks=blocks, status="partial", reason=reason, title=title, authors=by)
    return Extraction(blocks=blocks, title=title, authors=by)
