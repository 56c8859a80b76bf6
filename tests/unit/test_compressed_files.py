"""A single compressed file (gzip, bzip2, xz) is read as the file inside it, by that file's extractor; bombs and
corrupt data end with a status, never an exception; archives (.tar.gz) stay containers. A compressed file is
bounded like an archive member (ratio, member size, the top-level file's expanded-bytes budget)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random

import pytest

from kdbl_worker import extract
from kdbl_worker.extract import containers
from kdbl_worker.extract.base import Source


MIB = 1 << 20
LINE = b"GET /kestrel/api/v1/items?page=1 HTTP/1.1 200 512\n"
PACKERS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}


def _extract(name: str, data: bytes, bounds: containers.Bounds | None = None,
             budget: containers.Budget | None = None):
    return extract.extract(Source(io.BytesIO(data), name, len(data), bounds=bounds, budget=budget))


def _bomb(suffix: str, mib: int) -> bytes:
    """`mib` MiB of one repeated log line: one compressed MiB repeated (gzip, bzip2 and xz streams may be
    concatenated, and their readers read on), so even bzip2 takes a fraction of a second to build."""
    return PACKERS[suffix](LINE * (MIB // len(LINE))) * mib


def _words(size: int, seed: int = 27) -> bytes:
    """Text that compresses about 3:1 (no bomb): random words from a small vocabulary."""
    rng = random.Random(seed)
    vocabulary = [bytes(rng.choices(b"abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(5000)]
    out = bytearray()
    while len(out) < size:
        out += b" ".join(rng.choices(vocabulary, k=12)) + b".\n"
    return bytes(out[:size])


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


def test_a_compressed_binary_format_past_the_member_size_is_refused_after_one_bounded_read():
    data = gzip.compress(_words(3 * MIB))  # ~3:1, no bomb
    result = _extract("big.pdf.gz", data, containers.Bounds(max_member_bytes=MIB))
    assert result.status == "skipped" and "expands to more than 1.0 MiB" in result.reason
    assert "KDBL_CONTAINER_MAX_MEMBER_BYTES" in result.reason


def test_a_huge_compressed_log_is_indexed_up_to_the_member_size_and_says_so():
    result = _extract("server.log.gz", gzip.compress(_words(3 * MIB)), containers.Bounds(max_member_bytes=MIB))
    assert result.status == "partial" and "only the first 1.0 MiB" in result.reason
    assert 0 < sum(len(b.text) for b in result.blocks) <= MIB


@pytest.mark.parametrize("suffix", [".bz2", ".xz", ".gz"])
def test_a_compressed_text_bomb_is_refused_by_the_ratio_as_an_archive_member_is(suffix):
    data = _bomb(suffix, 64)  # 64 MiB of one line; the same text in a .zip or .tar.gz is refused by ratio
    assert len(data) < 256 << 10
    budget = containers.Budget()
    result = _extract("access.log" + suffix, data, budget=budget)
    assert result.status == "skipped" and result.blocks == []
    assert "bomb refused" in result.reason and "ratio > 200" in result.reason
    assert budget.bytes == 0  # nothing inflated was kept
    zipped = containers.expand("same.zip", io.BytesIO(_zip({"access.log": LINE * (64 * MIB // len(LINE))})),
                               containers.Bounds(), containers.Budget())
    [member] = list(zipped.members)
    assert member.data is None and "ratio > 200" in member.problem


def test_the_ratio_bound_follows_the_configured_bounds():
    data = _bomb(".xz", 4)
    assert _extract("a.log.xz", data).status == "skipped"
    lenient = _extract("a.log.xz", data, containers.Bounds(max_ratio=100_000))
    assert lenient.status == "ok" and sum(len(b.text) for b in lenient.blocks) > 3 * MIB


def test_what_a_compressed_file_inflates_is_charged_to_its_top_level_files_budget():
    bounds = containers.Bounds(max_expanded_bytes=3 * MIB)
    budget = containers.Budget(bytes=2 * MIB)  # what the rest of its archive took already
    result = _extract("notes.txt.gz", gzip.compress(_words(2 * MIB)), bounds, budget)
    assert result.status == "partial" and "KDBL_CONTAINER_MAX_EXPANDED_BYTES" in result.reason
    assert budget.bytes == 3 * MIB
    spent = _extract("more.txt.gz", gzip.compress(_words(MIB)), bounds, budget)
    assert spent.status == "skipped" and "expanded size cap reached" in spent.reason  # nothing left


def test_compressed_members_of_an_archive_share_its_expanded_bytes_budget():
    from kdbl_worker.sandbox import Limits, extract_and_chunk

    data = _zip({"a.log.gz": gzip.compress(_words(2 * MIB, 1)), "b.log.gz": gzip.compress(_words(2 * MIB, 2))})
    outcome = extract_and_chunk("logs.zip", len(data), io.BytesIO(data),
                                Limits(container_max_expanded_bytes=5 * MIB))
    kids = {kid.path: kid.outcome for kid in outcome.children}
    assert kids["a.log.gz"].status == "ok"
    assert kids["b.log.gz"].status == "partial" and "KDBL_CONTAINER_MAX_EXPANDED_BYTES" in kids["b.log.gz"].reason
    assert sum(kid.text_chars for kid in kids.values()) <= 5 * MIB


def test_compressed_binary_junk_is_refused_like_uncompressed_junk():
    result = _extract("blob.gz", gzip.compress(bytes(range(256)) * 64))
    assert result.status == "skipped" and "binary content" in result.reason


def _zip(entries: dict[str, bytes]) -> bytes:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buf.getvalue()
