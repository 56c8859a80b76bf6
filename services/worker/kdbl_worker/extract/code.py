"""Source code, configuration, markup and logs as text with their language; unknown files by their content.

Which extension or file name is which language is the table in extract/formats.py (the CODE rows; the row's
label is the language), not pygments' filename mapping: pygments is only here as a test tool (pytest pulls
it in), and its first `get_lexer_for_filename` costs 62 ms (entry points + lexer map; measured, 3 runs,
62-65 ms) in every sandbox child, against 2.7 us for `extract.detect` on our table; the table also says
what we index (`.org` is Emacs Org text, not Lotus Organizer as the MIME database says) and feeds README.

Blocks keep line structure: a file is cut only at blank lines followed by a line at column 0 (top-level
definitions in most languages, paragraphs in markup), so a block never starts inside an indented body and the
text `get_file_text` returns keeps its indentation; the chunker cuts longer blocks at line ends
(chunking.py, `lines=True` for these content types).

A file no row reads is sniffed: its first 64 KB (`SNIFF_BYTES`) decide. Binary junk (NUL bytes, control
characters anywhere in them) is refused after that one bounded read, so an unknown binary costs the same
whatever its size (a 16 MB one: one 64 KB read); text is indexed as text/plain with the reason "detected as
text by content", or as a script in its language when its first line is a `#!` line naming an interpreter
(`#!/usr/bin/env bash`: "language: Shell (#! line)").
"""

from __future__ import annotations

import re

from kdbl_worker.extract import formats
from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import Decoded, decode

SNIFF_BYTES = 64 * 1024
BINARY = "unsupported format (binary content)"
# one or more blank lines, then a line that starts at column 0
_TOP_LEVEL = re.compile(r"\n(?:[ \t]*\n)+(?=\S)")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f]")
_SHEBANG = re.compile(r"#![ \t]*\S*/(?:env[ \t]+(?:-\S+[ \t]+)*)?([A-Za-z][\w.+-]*)")
_INTERPRETERS = {"sh": ".sh", "bash": ".sh", "zsh": ".sh", "ksh": ".sh", "dash": ".sh", "ash": ".sh",
                 "python": ".py", "pypy": ".py", "perl": ".pl", "ruby": ".rb", "node": ".js", "deno": ".ts",
                 "php": ".php", "lua": ".lua", "Rscript": ".r", "pwsh": ".ps1", "groovy": ".groovy"}
_ASSIGNMENT = re.compile(r"^(\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_.-]*\s*[=:])(.*)$")


def blocks_of(text: str) -> list[Block]:
    """Cut at blank lines before a column-0 line; indented bodies stay with their header."""
    return [Block(part.strip("\n").rstrip()) for part in _TOP_LEVEL.split(text) if part.strip()]


def _decode(source: Source, head: bytes = b"") -> Decoded:
    return decode(head + source.stream.read())


def _result(text: str, decoded: Decoded, reason: str, content_type: str | None = None) -> Extraction:
    """ok, or partial when bytes were replaced; the reason: the language, then the encoding if not UTF-8."""
    return Extraction(blocks=blocks_of(text), status="partial" if decoded.lossy else "ok",
                      reason=f"{reason}; {decoded.note}" if decoded.note else reason,
                      content_type=content_type)


def extract_code(source: Source) -> Extraction:
    row = formats.lookup(source.name)
    language = row.label if row else "text"
    decoded = _decode(source)
    if decoded.text is None:
        return Extraction.skipped(f"{BINARY[:-1]}, not {language} text)")
    return _result(decoded.text, decoded, f"language: {language}")


def extract_dotenv(source: Source) -> Extraction:
    """.env files hold credentials: index the variable names, never their values."""
    decoded = _decode(source)
    if decoded.text is None:
        return Extraction.skipped(f"{BINARY[:-1]}, not dotenv text)")
    lines = []
    for line in decoded.text.splitlines():
        match = _ASSIGNMENT.match(line)
        if line.lstrip().startswith("#") or not match:
            lines.append(line)
        else:
            lines.append(f"{match.group(1)}<redacted>" if match.group(2).strip() else line)
    return _result("\n".join(lines), decoded, "language: dotenv; values redacted")


def _binary(text: str | None) -> bool:
    """The decoder's verdict looks at the first 8 KB; the sniff also refuses control characters (a NUL, or
    more than 5%) anywhere in the decoded 64 KB, so a text header in front of binary data is not text."""
    return text is None or "\x00" in text or len(_CONTROL.findall(text)) > len(text) * 0.05


def extract_unknown(source: Source) -> Extraction:
    """No row for this name: index it as text/plain when its first 64 KB are text, else refuse it."""
    head = source.stream.read(SNIFF_BYTES)
    if _binary(decode(head).text):
        return Extraction.skipped(BINARY)
    decoded = _decode(source, head)
    if decoded.text is None:
        return Extraction.skipped(BINARY)
    row = _interpreter(decoded.text)
    if row is not None:  # a script without an extension: its #! line names the language
        return _result(decoded.text, decoded, f"language: {row.label} (#! line)", row.content_type)
    return _result(decoded.text, decoded, "detected as text by content", "text/plain")


def _interpreter(text: str) -> formats.Format | None:
    """The row of a script's interpreter from its first line (`#!/usr/bin/env python3`, `#!/bin/sh`)."""
    match = _SHEBANG.match(text)
    if match is None:
        return None
    name = match.group(1).rstrip("0123456789.")
    return formats.by_extension().get(_INTERPRETERS.get(name, ""))
