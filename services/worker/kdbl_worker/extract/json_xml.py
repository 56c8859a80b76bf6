"""JSON, JSON Lines and XML as text.

JSON is flattened to "path: value" lines (`a.b[0].c: 42`); XML gives the text of its
elements in document order. XML goes through defusedxml: a DTD that declares entities
(billion laughs) or points outside the file (XXE) is refused, never expanded or fetched.

Both are decoded by extract/encoding.py first (BOM, UTF-16/32 by their NUL pattern, UTF-8, the
XML declaration's encoding, detection) and the parser gets text: an XML declaration whose encoding
disagrees with the bytes (UTF-16 bytes declared ISO-8859-1, latin-1 bytes declared UTF-8) no longer
fails the file; the encoding used is in the status reason when it is not plain UTF-8.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import defusedxml
import defusedxml.ElementTree as safe_et

from kdbl_worker.extract.base import Block, Extraction, Source
from kdbl_worker.extract.encoding import Decoded, decode

LINES_PER_BLOCK = 50
MAX_LINES = 500_000
MAX_VALUE_CHARS = 2_000
_XML_ENCODING = re.compile(rb"""\A\s*<\?xml[^>]*?\sencoding\s*=\s*["']([A-Za-z0-9._:-]+)["']""")


def _flatten(value: object, root: str = "") -> Iterator[str]:
    """Yield "path: value" lines depth-first, iteratively (deep nesting cannot overflow the stack)."""
    stack: list[tuple[str, object]] = [(root, value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            if not node:
                yield f"{path or '$'}: {{}}"
            for key, child in reversed(list(node.items())):
                stack.append((f"{path}.{key}" if path else str(key), child))
        elif isinstance(node, list):
            if not node:
                yield f"{path or '$'}: []"
            for index in range(len(node) - 1, -1, -1):
                stack.append((f"{path}[{index}]", node[index]))
        else:
            text = "null" if node is None else json.dumps(node) if isinstance(node, bool) else str(node)
            text = " ".join(text.split())[:MAX_VALUE_CHARS]
            yield f"{path or '$'}: {text}"


def _blocks(lines: Iterator[str], max_lines: int) -> tuple[list[Block], bool]:
    """Group lines into Blocks; returns (blocks, whether the line cap cut the input)."""
    blocks: list[Block] = []
    batch: list[str] = []
    count = 0
    capped = False
    for line in lines:
        if count >= max_lines:
            capped = True
            break
        count += 1
        batch.append(line)
        if len(batch) == LINES_PER_BLOCK:
            blocks.append(Block("\n".join(batch)))
            batch = []
    if batch:
        blocks.append(Block("\n".join(batch)))
    return blocks, capped


def _result(lines: Iterator[str], decoded: Decoded, max_lines: int) -> Extraction:
    blocks, capped = _blocks(lines, max_lines)
    problems = [p for p in (decoded.note, f"line cap reached ({max_lines} lines)" if capped else None) if p]
    return Extraction(blocks=blocks, status="partial" if decoded.lossy or capped else "ok",
                      reason="; ".join(problems) or None)


def extract_json(source: Source, *, max_lines: int = MAX_LINES) -> Extraction:
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    try:
        data = json.loads(decoded.text)
    except json.JSONDecodeError as exc:
        return Extraction.failed(f"invalid JSON: {exc}")
    except RecursionError:
        return Extraction.failed("invalid JSON: nested too deeply")
    return _result(_flatten(data), decoded, max_lines)


def extract_jsonl(source: Source, *, max_lines: int = MAX_LINES) -> Extraction:
    """JSON Lines / NDJSON: each record flattened under its 1-based line number (`3.name: x`)."""
    decoded = decode(source.stream.read())
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    bad: list[int] = []

    def lines() -> Iterator[str]:
        for number, raw in enumerate(decoded.text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, RecursionError):
                bad.append(number)
                continue
            yield from _flatten(record, root=f"[{number}]")

    result = _result(lines(), decoded, max_lines)
    if bad:
        note = f"{len(bad)} invalid JSON lines skipped (first: line {bad[0]})"
        if not result.blocks:
            return Extraction.failed(note)
        result.status, result.reason = "partial", "; ".join(filter(None, [result.reason, note]))
    return result


def _xml_lines(root) -> Iterator[str]:
    """Text and tail pieces in document order (iterative: no recursion limit on deep trees)."""
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        element, is_tail = stack.pop()
        if is_tail:
            piece = element.tail
        else:
            piece = element.text
            if element is not root:
                stack.append((element, True))
            stack.extend((child, False) for child in reversed(element))
        if piece and piece.strip():
            yield " ".join(piece.split())


def extract_xml(source: Source, *, max_lines: int = MAX_LINES) -> Extraction:
    data = source.stream.read()
    declared = _XML_ENCODING.match(data.removeprefix(b"\xef\xbb\xbf")[:512])
    decoded = decode(data, declared.group(1).decode("ascii") if declared else None)
    if decoded.text is None:
        return Extraction.failed(decoded.note or "not text")
    try:
        # Text, not bytes: expat then ignores the declared encoding (decode chose it). forbid_dtd
        # stays False (many real files carry a harmless DOCTYPE); entity declarations and external
        # references raise instead of being expanded.
        root = safe_et.fromstring(decoded.text, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as exc:
        return Extraction.failed(f"refused unsafe XML ({type(exc).__name__}: {exc})")
    except safe_et.ParseError as exc:
        return Extraction.failed(f"invalid XML: {exc}")
    return _result(_xml_lines(root), decoded, max_lines)
