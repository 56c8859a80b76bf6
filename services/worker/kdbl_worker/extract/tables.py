"""A table row is one line of text, its cells in order joined by CELL_SEPARATOR, in every format
that has tables (PDF via pdf_layout, DOCX, XLSX/XLS, HTML; ODT and PPTX write the same).

Why " | " and not a tab: search snippets and most displays fold whitespace, so a tab turns into a
space and a multi-word label runs into its first value ("Cost of sales 223,546"), while " | " stays
("Cost of sales | 223,546"); it reads as a table to a language model (Markdown rows use it); and it
is no search term (Postgres' to_tsvector and the embedding tokenizers drop it), so BM25 is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable

CELL_SEPARATOR = " | "


def row_text(cells: Iterable[str]) -> str:
    """One row: each cell's whitespace folded (a cell never breaks the line), empty cells kept in
    their place, trailing ones dropped."""
    out = [" ".join(cell.split()) for cell in cells]
    while out and not out[-1]:
        out.pop()
    return CELL_SEPARATOR.join(out)
