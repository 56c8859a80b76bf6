"""The one format table: README's list is generated from it, and every row is well-formed and dispatchable."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from kdbl_control.cli import main
from kdbl_worker.extract import formats

README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_section() -> str:
    text = README.read_text()
    assert formats.BEGIN in text and formats.END in text, "README lacks the generated formats section"
    return text[text.index(formats.BEGIN):text.index(formats.END) + len(formats.END)] + "\n"


def test_readme_lists_exactly_the_formats_of_the_table():
    # on failure: run `kdbl-control formats --markdown` and put its output between README's markers
    assert _readme_section() == formats.markdown()


def test_kdbl_control_formats_prints_the_readme_section(capsys):
    with pytest.raises(SystemExit) as done:
        main(["formats", "--markdown"])
    assert done.value.code == 0
    assert capsys.readouterr().out == formats.markdown()


def test_each_extension_and_file_name_belongs_to_one_row():
    seen: dict[str, str] = {}
    for row in formats.FORMATS:
        for ext in row.extensions:
            key = ext.lower()
            assert key not in seen, f"{ext} is in both {seen[key]!r} and {row.label!r}"
            seen[key] = row.label


def test_every_row_is_well_formed_and_names_an_extractor_that_exists():
    for row in formats.FORMATS:
        assert row.extensions and row.label and "/" in row.content_type, row
        for ext in row.extensions:
            assert ext == ext.strip() and "/" not in ext, ext
            assert ext == ext.lower() or not ext.startswith("."), ext  # a name (README) keeps its usual case
        module, func = row.target.split(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin, row.target
        assert f"def {func}(" in Path(spec.origin).read_text(), row.target
