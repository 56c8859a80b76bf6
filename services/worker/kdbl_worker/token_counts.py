"""Each chunk's length in the embedding model's tokens (`chunks.text_tokens`, a hit's `token_count`).

An agent reads `token_count` to budget its context before it fetches a chunk, so the number is the one
the embedding model's tokenizer gives when the worker has that model (KDBL_EMBED_MODEL_PATH): a
vocab-only load of the GGUF (kdbl_core.embedder.Tokenizer). Without a model — or when the model cannot
be loaded (logged once) — a deterministic estimate stands in (`estimate`): WordPiece-like, one token per
punctuation mark and per CJK ideograph, a word of up to WORD_CHARS letters one token and one more per
EXTRA_CHARS letters beyond, a digit run one token per DIGIT_CHARS digits (8, 2, 3: the smallest error of
a grid over 4-8, 2-5 and 2-4 on SciFact's abstracts).

Measured on the chunks of SciFact (5,183 abstracts, 7.8 MB, 7,094 chunks; all-MiniLM-L6-v2's tokenizer;
docs/benchmarks.md "Per-chunk token counts"): the estimate is off by 7.2% per chunk on average (mean
absolute relative error; median 5.7%, p95 19%) and +0.1% over the corpus; on the docs corpus' Markdown
(227 chunks) 7.1% per chunk, -5.8% in all. The tokenizer costs 0.046-0.055 s per MB of chunk text (the
estimate about the same, 0.045): ≈70-85 µs per 1.5 KB abstract, ~2-2.5% of the crawl's 2.1-2.4 s per MB
of SciFact (0.42-0.47 MB/s, bound by Postgres), though twice the 0.023 s per MB that decoding and
chunking plain text take. `python -m kdbl_worker.bench_tokens` measures it.

It runs in the worker process, not in the extraction children: llama_cpp alone maps ~150 MB of address
space, more than the children's smallest memory cap (KDBL_EXTRACT_MEMORY_MB may be 64), and each child
would hold its own copy; in the worker one load serves every writer thread.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable

from kdbl_core.settings import Settings

log = logging.getLogger(__name__)

WORD_CHARS = 8
EXTRA_CHARS = 2
DIGIT_CHARS = 3
# a CJK ideograph (one token each in BERT's tokenizer), a run of other letters, a digit run, one other mark
_PIECE = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[^\W\d_]+|\d+|[^\w\s]|_")


def estimate(text: str) -> int:
    """A deterministic WordPiece-like token count (see the module docstring for its measured error)."""
    total = 0.0
    for piece in _PIECE.findall(text):
        first = piece[0]
        if first.isdigit():
            total += 1 + (len(piece) - 1) / DIGIT_CHARS
        elif first.isalpha() and len(piece) > WORD_CHARS:
            total += 1 + (len(piece) - WORD_CHARS) / EXTRA_CHARS
        else:
            total += 1
    return round(total)


def counter(settings: Settings) -> Callable[[str], int]:
    """The count the worker stores: the model's tokenizer when configured and loadable, else `estimate`."""
    if not settings.embed_model_path:
        return estimate
    from kdbl_core.embedder import Tokenizer
    from kdbl_core.errors import ConfigError

    try:
        return Tokenizer(settings.embed_model_path).count
    except ConfigError as exc:
        log.warning("tokenizer unavailable; token counts are estimates",
                    extra={"model_path": settings.embed_model_path, "error": exc.message})
        return estimate
