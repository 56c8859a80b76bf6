"""Source code, configuration, markup, logs and files without a known extension extract as text.

Every sample is written here. Each test states behaviour: the status, the reason (the language, or
"detected as text by content"), the content type and the text, and how code is cut into blocks and chunks.
"""

from __future__ import annotations

import io
import random

import pytest
from kdbl_worker.chunking import chunk_blocks
from kdbl_worker.extract import Extraction, Source, detect, extract, formats

PYTHON = b'''"""A module."""

import os


class Ledger:
    def total(self):
        return sum(self.rows)

    def lookup_ledger_entry(self, key):
        return self.rows[key]


def main():
    print(Ledger().total())
'''


def run(data: bytes, name: str) -> Extraction:
    return extract(Source(io.BytesIO(data), name, len(data)))


@pytest.mark.parametrize(("name", "data", "content_type", "language", "needle"), [
    ("ledger.py", PYTHON, "text/x-python", "Python", "def lookup_ledger_entry"),
    ("main.go", b"package main\n\nfunc frobnicateWidget() int {\n\treturn 1\n}\n", "text/x-go", "Go",
     "func frobnicateWidget"),
    ("lib.rs", b"pub fn parse_header(x: &str) -> usize {\n    x.len()\n}\n", "text/x-rust", "Rust",
     "parse_header"),
    ("App.java", b"public class App {\n    void run() {}\n}\n", "text/x-java", "Java", "public class App"),
    ("util.c", b"#include <stdio.h>\nint add(int a, int b) { return a + b; }\n", "text/x-c", "C", "int add"),
    ("view.tsx", b"export const View = () => <div>hello</div>;\n", "text/x-typescript", "TypeScript",
     "export const View"),
    ("deploy.sh", b"#!/bin/sh\nset -eu\necho deploying\n", "text/x-shellscript", "Shell", "echo deploying"),
    ("query.sql", b"SELECT id FROM invoices WHERE paid;\n", "application/sql", "SQL", "FROM invoices"),
    ("Build.ps1", b"Write-Host 'building'\n", "text/x-powershell", "PowerShell", "Write-Host"),
    ("values.yaml", b"replicas: 3\nimage: nginx\n", "application/yaml", "YAML", "replicas: 3"),
    ("pyproject.toml", b"[project]\nname = 'x'\n", "application/toml", "TOML", "[project]"),
    ("app.ini", b"[server]\nport = 8080\n", "text/x-ini", "INI / config", "port = 8080"),
    ("schema.proto", b'syntax = "proto3";\nmessage Invoice { int64 id = 1; }\n', "text/x-protobuf",
     "Protocol Buffers", "message Invoice"),
    ("style.scss", b".btn { color: red; }\n", "text/x-scss", "Sass", ".btn"),
    ("fix.patch", b"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n", "text/x-diff", "Diff", "+new"),
    ("server.log", b"2026-01-01 12:00:00 ERROR disk quota exceeded\n", "text/x-log", "Log", "disk quota"),
    ("notes.org", b"#+TITLE: Plans\n* TODO Write the quarterly report\n  SCHEDULED: <2026-01-05>\n",
     "text/x-org", "Org", "* TODO Write the quarterly report"),
    ("paper.tex", b"\\documentclass{article}\n\\begin{document}\nThe Riemann hypothesis.\n\\end{document}\n",
     "text/x-tex", "TeX / LaTeX", "The Riemann hypothesis."),
    ("guide.adoc", b"= Guide\n\nInstall the widget.\n", "text/asciidoc", "AsciiDoc", "Install the widget."),
    ("Dockerfile", b"FROM debian:bookworm\nRUN apt-get update\n", "text/x-dockerfile", "Dockerfile",
     "FROM debian:bookworm"),
    ("Dockerfile.prod", b"FROM alpine\n", "text/x-dockerfile", "Dockerfile", "FROM alpine"),
    ("Makefile", b"all:\n\tcc -o app main.c\n", "text/x-makefile", "Makefile", "\tcc -o app main.c"),
    (".gitignore", b"*.pyc\n__pycache__/\n", "text/x-ignore", "Ignore rules", "__pycache__/"),
])
def test_code_config_and_markup_extract_as_text_with_their_language(name, data, content_type, language,
                                                                     needle):
    result = run(data, name)
    assert (result.status, result.reason, result.content_type) == ("ok", f"language: {language}",
                                                                   content_type)
    assert needle in "\n\n".join(b.text for b in result.blocks)
    assert detect(name)[0] == content_type


def test_svg_xml_vocabularies_and_notebooks_go_to_the_xml_and_json_extractors():
    svg = run(b'<svg xmlns="http://www.w3.org/2000/svg"><title>Sales chart</title><path d="M0 0 L9 9"/>'
              b'<text x="1">Revenue 2024</text></svg>', "chart.svg")
    assert (svg.status, svg.content_type, [b.text for b in svg.blocks]) == (
        "ok", "image/svg+xml", ["Sales chart\nRevenue 2024"])
    project = run(b"<Project><PropertyGroup><AssemblyName>Ledgerly</AssemblyName></PropertyGroup></Project>",
                  "Ledgerly.csproj")
    assert project.status == "ok" and "Ledgerly" in project.blocks[0].text
    notebook = run(b'{"cells": [{"cell_type": "code", "source": ["import quillwort"]}], "nbformat": 4}',
                   "analysis.ipynb")
    assert notebook.status == "ok" and "import quillwort" in notebook.blocks[0].text


def test_org_is_emacs_org_text_not_lotus_organizer():
    assert detect("plans.org") == ("text/x-org", formats.CODE)
    assert run(b"* Heading\nbody\n", "plans.org").status == "ok"


def test_files_without_an_extension_are_read_by_their_well_known_name():
    for name in ("README", "LICENSE", "CHANGELOG", "src/COPYING"):
        result = run(b"Permission is hereby granted, free of charge.\n", name)
        assert (result.status, result.content_type) == ("ok", "text/plain"), name
        assert result.blocks[0].text == "Permission is hereby granted, free of charge."


def test_code_is_cut_at_top_level_definitions_and_keeps_indentation():
    blocks = [b.text for b in run(PYTHON, "ledger.py").blocks]
    assert blocks == [
        '"""A module."""',
        "import os",
        "class Ledger:\n    def total(self):\n        return sum(self.rows)\n\n"
        "    def lookup_ledger_entry(self, key):\n        return self.rows[key]",
        "def main():\n    print(Ledger().total())",
    ]


def test_long_code_is_chunked_at_line_ends_never_mid_line():
    body = "".join(f"    value_{i} = compute(alpha. beta, {i})  # step {i}. next\n" for i in range(200))
    result = run(f"def big():\n{body}".encode(), "big.py")
    assert formats.line_structured(result.content_type)
    full, chunks = chunk_blocks(result.blocks, target=1200, max_chars=1800, lines=True)
    assert len(chunks) > 3
    for chunk in chunks:  # each chunk starts at a line's first character and ends at a line end
        assert full[:chunk.char_start].rsplit("\n", 1)[-1].strip() == ""
        assert chunk.char_end == len(full) or full[chunk.char_end - 1] == "\n"


def test_a_dotenv_file_is_indexed_by_its_names_never_its_values():
    result = run(b"# database\nDB_PASSWORD=hunter2\nexport API_TOKEN='s3cr3t'\nEMPTY=\n", ".env.production")
    text = "\n".join(b.text for b in result.blocks)
    assert (result.status, result.content_type) == ("ok", "text/x-dotenv")
    assert result.reason == "language: dotenv; values redacted"
    assert "DB_PASSWORD=<redacted>" in text and "API_TOKEN=<redacted>" in text and "# database" in text
    assert "hunter2" not in text and "s3cr3t" not in text
    assert run(b"KEY=value\n", "settings.env").content_type == "text/x-dotenv"


def test_code_in_a_legacy_encoding_says_its_language_and_its_encoding():
    source = "# r\u00e9sum\u00e9 des donn\u00e9es fran\u00e7aises, \u00e9t\u00e9 \u00e0 No\u00ebl\n"
    result = run((source + "def f():\n    return 'caf\u00e9'\n").encode("cp1252"), "legacy.py")
    assert (result.status, result.reason) == ("ok", "language: Python; encoding: windows-1252 (detected)")
    assert "return 'caf\u00e9'" in result.blocks[-1].text


def test_utf16_text_with_an_unknown_extension_is_detected_as_text_by_content():
    result = run("Notes in UTF-16 from a Windows tool.\n".encode("utf-16"), "notes.q7z")
    assert result.status == "ok" and result.reason.startswith("detected as text by content; encoding: utf-16")
    assert result.blocks[0].text == "Notes in UTF-16 from a Windows tool."


def test_utf8_text_with_an_unknown_extension_is_detected_as_text_by_content():
    result = run("Grüße aus Köln.\n\nZweiter Absatz über Straßen.\n".encode(), "notes.q7z")
    assert (result.status, result.reason) == ("ok", "detected as text by content")
    assert result.content_type == "text/plain"
    assert [b.text for b in result.blocks] == ["Grüße aus Köln.", "Zweiter Absatz über Straßen."]


def test_a_text_file_without_any_extension_or_known_name_is_detected_by_content():
    result = run(b"host=db.internal\nport=5432\n", "conn-settings")
    assert (result.status, result.reason) == ("ok", "detected as text by content")
    assert result.content_type == "text/plain"


@pytest.mark.parametrize(("first_line", "language", "content_type"), [
    ("#!/bin/sh", "Shell", "text/x-shellscript"),
    ("#!/usr/bin/env bash", "Shell", "text/x-shellscript"),
    ("#!/usr/bin/env -S python3.11 -u", "Python", "text/x-python"),
    ("#!/usr/bin/perl -w", "Perl", "text/x-perl"),
])
def test_a_script_without_an_extension_is_known_by_its_interpreter_line(first_line, language, content_type):
    result = run(f"{first_line}\necho release\n".encode(), "bin/release")
    assert (result.status, result.reason, result.content_type) == ("ok", f"language: {language} (#! line)",
                                                                   content_type)


def test_binary_junk_with_an_unknown_extension_stays_refused():
    junk = random.Random(14).randbytes(200_000)
    result = run(junk, "blob.q7z")
    assert result.status == "skipped" and result.reason == "unsupported format (binary content)"
    assert result.blocks == []


def test_a_text_header_in_front_of_binary_data_is_not_text():
    data = b"HEADER v1 generated by exporter\n" * 400 + random.Random(3).randbytes(40_000)  # 13 KB, then junk
    assert run(data, "dump.q7z").reason == "unsupported format (binary content)"


class _CountingStream(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.read_bytes = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.read_bytes += len(chunk)
        return chunk


def test_an_unknown_binary_costs_one_bounded_read_whatever_its_size():
    data = b"\x00\x01\x02\x03" * (4 * 1024 * 1024)  # 16 MB
    stream = _CountingStream(data)
    result = extract(Source(stream, "disk.img9", len(data)))
    assert result.reason == "unsupported format (binary content)"
    assert stream.read_bytes == 64 * 1024


def test_a_binary_file_under_a_code_extension_is_refused_not_indexed():
    result = run(b"G\x40\x00\x10\x00\x00\xb0" * 1000, "clip.ts")  # an MPEG transport stream, not TypeScript
    assert result.status == "skipped"
    assert result.reason == "unsupported format (binary content, not TypeScript text)"
