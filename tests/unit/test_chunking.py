"""Chunks are exact slices of the extracted text, keep reading order, and never span pages."""

from __future__ import annotations

from kdbl_worker.chunking import chunk_blocks
from kdbl_worker.extract.base import Block


def test_every_chunk_is_a_slice_of_the_full_text():
    blocks = [Block(f"Paragraph {i}. " + "word " * (i * 20)) for i in range(12)]
    full, chunks = chunk_blocks(blocks, target=300, max_chars=400)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert full[c.char_start:c.char_end] == c.text
        assert len(c.text) <= 400
    starts = [c.char_start for c in chunks]
    assert starts == sorted(starts)
    where = [next(i for i, c in enumerate(chunks) if f"Paragraph {n}." in c.text) for n in range(12)]
    assert where == sorted(where)  # reading order kept


def test_a_chunk_never_spans_two_pages():
    blocks = [Block("page one text", page_no=1), Block("more page one", page_no=1), Block("page two", page_no=2)]
    _, chunks = chunk_blocks(blocks, target=800)
    assert [(c.page_no, c.text) for c in chunks] == [(1, "page one text\n\nmore page one"), (2, "page two")]


def test_a_long_block_is_cut_at_sentence_boundaries():
    sentence = "The quick brown fox jumps over the lazy dog. "
    full, chunks = chunk_blocks([Block(sentence * 100)], target=400, max_chars=500)
    assert len(chunks) > 5
    assert all(c.text.rstrip().endswith(".") for c in chunks[:-1])
    assert "".join(full[c.char_start:c.char_end] for c in chunks).replace(" ", "") == full.replace(" ", "")


def test_timed_blocks_keep_the_first_start_and_last_end():
    blocks = [Block("hello", ts_start_ms=1000, ts_end_ms=2000), Block("world", ts_start_ms=2500, ts_end_ms=4000)]
    _, [chunk] = chunk_blocks(blocks, target=800)
    assert (chunk.ts_start_ms, chunk.ts_end_ms) == (1000, 4000)


def test_blank_blocks_produce_no_chunks():
    full, chunks = chunk_blocks([Block("   "), Block("")])
    assert full == "" and chunks == []


def test_a_title_joins_the_paragraph_it_introduces_when_that_fits() -> None:
    title, body = "Structural Homeostasis of Dendrites", "word " * 260  # body ~1300 chars, over the target
    _, chunks = chunk_blocks([Block(title), Block(body.strip())], target=1200, max_chars=1800)
    assert len(chunks) == 1 and chunks[0].text.startswith(title + "\n\n")
    # title + a paragraph longer than max_chars: the limit still holds for every chunk
    _, chunks = chunk_blocks([Block(title), Block(("word " * 500).strip())], target=1200, max_chars=1800)
    assert chunks[0].text.startswith(title) and all(len(c.text) <= 1800 for c in chunks)
    # a long first block never swallows the next one beyond the target
    _, chunks = chunk_blocks([Block("x " * 400), Block("y " * 400)], target=1200, max_chars=1800)
    assert len(chunks) == 2
