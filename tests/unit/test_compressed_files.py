"""A single compressed file (gzip, bzip2, xz) is read as the file inside it, by that file's extractor; bombs and
corrupt data end with a status, never an exception; archives (.tar.gz) stay containers."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma

import pytest

from kdbl_worker import extract
from kdbl_worker.extract import compressed, containers
from kdbl_worker.extract.base import Source


def _extract(name: str, data: bytes):
    return extract.extract(Source(io.BytesIO(data), name, len(data)))


@pytest.mark.parametrize("name, pack", [("changelog.Debian.gz", gzip.compress), ("app.log.1.bz2", bz2.compress),
                                        ("notes.txt.xz", lzma.compress)])
def test_a_compressed_text_file_is_indexed_as_its_text_with_the_compression_in_the_reason(name, pack):
    result = _extract(name, pack(b"pkg (1.0) unstable\n\n  * Fixed the walrus counter.\n"))
    assert result.status == "ok"
    assert any("walrus counter" in block.text for block in result.blocks)
    kind = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz"}[name[name.rindex("."):]]
    assert result.reason.startswith(f"{kind}-compressed")
    assert result.content_type == extract.detect(name)[0]  # the file's own type: its download is compressed


def test_the_file_inside_is_read_by_the_extractor_of_its_own_name():
    result = _extract("tool.py.gz", gzip.compress(b"def narwhal_count():\n    return 42\n"))
    assert result.status == "ok" and "language: Python" in result.reason
    markdown = _extract("guide.md.gz", gzip.compress(b"# Setup\n\nInstall the heron relay.\n"))
    assert markdown.reason.startswith("gzip-compressed text/markdown")
    assert any("heron relay" in block.text for block in markdown.blocks)


def test_archives_stay_containers_and_never_reach_the_single_file_reader():
    assert containers.is_container("bundle.tar.gz")
    assert extract.detect("bundle.tar.gz")[1] != extract.detect("notes.gz")[1]
    assert extract.detect("notes.gz")[1].endswith("compressed:extract_compressed")


def test_corrupt_compressed_data_fails_with_the_reason():
    result = _extract("broken.txt.gz", gzip.compress(b"some text here")[:-12])
    assert result.status == "failed" and result.reason.startswith("corrupt gzip data")


def test_a_gzip_bomb_of_a_binary_format_is_refused_after_one_bounded_read(monkeypatch):
    monkeypatch.setattr(compressed, "MAX_EXPANDED", 1 << 20)
    result = _extract("bomb.pdf.gz", gzip.compress(b"\0" * (8 << 20)))
    assert result.status == "skipped" and "expands to more than 1 MiB" in result.reason


def test_a_huge_compressed_log_is_indexed_up_to_the_limit_and_says_so(monkeypatch):
    monkeypatch.setattr(compressed, "MAX_EXPANDED", 1 << 20)
    result = _extract("server.log.gz", gzip.compress(b"GET /kestrel 200\n" * 200_000))
    assert result.status == "partial" and "only the first 1 MiB" in result.reason
    assert 0 < sum(len(b.text) for b in result.blocks) <= 1 << 20


def test_compressed_binary_junk_is_refused_like_uncompressed_junk():
    result = _extract("blob.gz", gzip.compress(bytes(range(256)) * 64))
    assert result.status == "skipped" and "binary content" in result.reason
