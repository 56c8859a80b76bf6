"""Text embeddings with a local GGUF model through llama.cpp (llama-cpp-python).

llama-cpp-python is imported and its models loaded (one at a time) by ``kdbl_core.llama_loader``, which
this module and ``kdbl_core.chat`` (the answer tool's chat model) share. One :class:`Embedder` owns one
llama.cpp context; a context is not thread-safe, so every evaluation runs under a lock. The lock is taken per
evaluated batch, not per call, and a waiting query (``embed_query``) goes before the next batch of a
background ``embed()``: in `kdbl-control up` the API and the corpus embedding share one model, and a
hybrid query used to wait behind a whole 32-chunk call (16 s for the first query of a fresh corpus,
~2 s after); now it waits for at most one batch (docs/benchmarks.md).

Truncation keeps the model's final ``[SEP]``: a text is tokenized as ``[CLS] ... [SEP]``,
cut to ``max_tokens`` and closed with ``[SEP]`` again, as sentence-transformers does
(llama-cpp-python's own ``embed(truncate=True)`` cuts at ``n_batch`` and drops it).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Self

import numpy as np

from kdbl_core import llama_loader
from kdbl_core.errors import ConfigError
from kdbl_core.llama_loader import gpu_offload_supported

log = logging.getLogger(__name__)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


DEFAULT_MODEL_FILE = "all-minilm-l6-v2.f16.gguf"
# The format of the text the worker embeds for a chunk (kdbl_core.content.analysis.embedding_text), part
# of every model id: h1 = the chunk's header line, a blank line, its text (before: the text alone).
# Change it with that function: stored vectors of another format are then re-embedded.
CHUNK_INPUT = "h1"


def default_model_path(model_dir: Path) -> Path | None:
    """The default model where airgap/model/build_model.py caches it (`model_dir`: the caller's
    settings.model_dir, KDBL_MODEL_DIR), if built."""
    path = model_dir / DEFAULT_MODEL_FILE
    return path if path.is_file() else None


class PriorityLock:
    """A mutex where urgent holders (queries) go before ordinary ones (background batches) that wait."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._busy = False
        self._urgent_waiting = 0

    @contextlib.contextmanager
    def hold(self, *, urgent: bool = False) -> Iterator[None]:
        with self._cond:
            self._urgent_waiting += urgent
            try:
                while self._busy or (not urgent and self._urgent_waiting):
                    self._cond.wait()
            finally:
                self._urgent_waiting -= urgent
            self._busy = True
        try:
            yield
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()


class Embedder:
    """Embeds texts with a GGUF embedding model (mean/CLS pooling as stored in the file)."""

    def __init__(
        self,
        model_path: str | Path,
        n_threads: int = 2,
        n_batch: int | None = None,
        max_tokens: int = 256,
        normalize: bool = True,
        query_cache_size: int = 1024,
        gpu_layers: int = 0,
    ) -> None:
        self._lib = lib = llama_loader.require()
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"embedding model not found: {path}", data={"model_path": str(path)})
        # Default: one sequence per decode. Several sequences in one ubatch share a unified KV cache,
        # and the attention then spans all of them (masked): 2048-token batches ran at 14 chunks/s,
        # 512 at 18.3, 256 at 19.5 (250-token chunks, docs/benchmarks.md).
        n_batch = n_batch or max_tokens
        if not 2 <= max_tokens <= n_batch:
            raise ConfigError(f"max_tokens must lie in [2, n_batch={n_batch}], got {max_tokens}")
        self._path = path
        self._model_id = f"{path.name}@{_sha256(path)[:12]}+{CHUNK_INPUT}"
        self._max_tokens = max_tokens
        self._normalize = normalize
        self._lock = PriorityLock()
        self._cache: OrderedDict[str, list[float]] = OrderedDict()
        self._cache_size = max(0, query_cache_size)
        self._cache_lock = threading.Lock()

        kwargs: dict[str, object] = {
            "model_path": str(path),
            "embedding": True,
            "n_ctx": n_batch,
            "n_batch": n_batch,
            "n_ubatch": n_batch,
            "n_threads": n_threads,
            "n_threads_batch": n_threads,
            "verbose": False,
        }
        if "flash_attn" in inspect.signature(lib.Llama.__init__).parameters:
            kwargs["flash_attn"] = True
        self.gpu_layers = 0
        if gpu_layers:
            if gpu_offload_supported():
                kwargs["n_gpu_layers"] = self.gpu_layers = gpu_layers
            else:
                log.warning("KDBL_EMBED_GPU_LAYERS is set but this llama-cpp-python has no GPU backend: "
                            "the embedding model runs on the CPU (install a CUDA build of llama-cpp-python)",
                            extra={"gpu_layers": gpu_layers})
        try:
            # verbose=False makes llama-cpp-python point fds 1 and 2 at /dev/null while it loads (dup2).
            # Two loads at once in one process can leave them there for good: the loader loads one at a time.
            self._llm = llama_loader.load_model(**kwargs)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot load embedding model {path}: {exc}") from exc

        # Llama.embed() only takes strings; batching token ids (to keep [SEP] after the cut)
        # needs the Llama's own context and batch objects.
        ctx = self._llm._ctx
        pooling = ctx.pooling_type()
        if pooling in (lib.LLAMA_POOLING_TYPE_NONE, lib.LLAMA_POOLING_TYPE_RANK):
            self._llm.close()
            raise ConfigError(
                f"{path.name} is not a sentence-embedding model (pooling type {pooling}); "
                "expected a GGUF with mean, CLS or last-token pooling"
            )
        n_ctx_train = int(lib.llama_model_n_ctx_train(self._llm.model))
        if max_tokens > n_ctx_train:
            self._llm.close()
            raise ConfigError(f"max_tokens={max_tokens} exceeds the model's context length {n_ctx_train}")
        self._ctx = ctx
        self._batch = self._llm._batch
        self._dim = int(self._llm.n_embd())
        self._n_batch = int(self._llm.n_batch)
        self._n_seq_max = int(self._llm.context_params.n_seq_max)
        self._sep = int(lib.llama_vocab_sep(lib.llama_model_get_vocab(self._llm.model)))
        if self._sep < 0:
            self._sep = int(self._llm.token_eos())

    # ------------------------------------------------------------------ properties

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def model_id(self) -> str:
        """File name, the first 12 hex digits of its sha256 and the chunk input's format, e.g.
        ``x.gguf@0123456789ab+h1``: what a stored vector was made with, so a new model or a new way of
        building the embedded text (CHUNK_INPUT) makes the worker embed every chunk again."""
        return self._model_id

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    # ------------------------------------------------------------------ tokens

    def tokenize(self, text: str) -> list[int]:
        """Token ids with ``[CLS]``/``[SEP]``, cut to ``max_tokens`` keeping the final ``[SEP]``."""
        tokens = self._llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
        if len(tokens) > self._max_tokens:
            tokens = tokens[: self._max_tokens - 1] + [self._sep]
        return tokens

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is, uncut and without ``[CLS]``/``[SEP]`` (payload sizes in tokens)."""
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    # ------------------------------------------------------------------ embeddings

    def embed(self, texts: Sequence[str], *, urgent: bool = False) -> list[list[float]]:
        """One vector per text, in order; texts are packed into batches of ``n_batch`` tokens.

        The model is locked per batch; `urgent` callers (queries) take it before waiting ordinary ones.
        """
        if isinstance(texts, str):
            raise TypeError("embed() takes a list of texts; use embed_query() for one")
        groups: list[list[list[int]]] = []
        group: list[list[int]] = []
        n_group = 0
        for tokens in (self.tokenize(t) for t in texts):
            if group and (n_group + len(tokens) > self._n_batch or len(group) >= self._n_seq_max):
                groups.append(group)
                group, n_group = [], 0
            group.append(tokens)
            n_group += len(tokens)
        if group:
            groups.append(group)
        out: list[list[float]] = []
        for group in groups:
            with self._lock.hold(urgent=urgent):
                out.extend(self._eval(group))
        return out

    def embed_query(self, text: str) -> list[float]:
        """One vector, served from a small LRU cache (the same list object on a hit)."""
        if self._cache_size:
            with self._cache_lock:
                hit = self._cache.get(text)
                if hit is not None:
                    self._cache.move_to_end(text)
                    return hit
        vec = self.embed([text], urgent=True)[0]
        if self._cache_size:
            with self._cache_lock:
                self._cache[text] = vec
                self._cache.move_to_end(text)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return vec

    def _eval(self, group: list[list[int]]) -> list[list[float]]:
        """Evaluate sequences that fit one batch; caller holds the lock."""
        self._batch.reset()
        for seq_id, tokens in enumerate(group):
            self._batch.add_sequence(tokens, seq_id, True)
        self._ctx.kv_cache_clear()
        self._ctx.decode(self._batch)
        vecs = np.empty((len(group), self._dim), dtype=np.float32)
        for seq_id in range(len(group)):
            ptr = self._lib.llama_get_embeddings_seq(self._ctx.ctx, seq_id)
            if not ptr:
                raise RuntimeError(f"llama.cpp returned no embedding for sequence {seq_id}")
            vecs[seq_id] = np.ctypeslib.as_array(ptr, shape=(self._dim,))
        self._batch.reset()
        if self._normalize:
            norms = np.linalg.norm(vecs, axis=1, keepdims=True)
            vecs /= np.maximum(norms, 1e-12)
        return vecs.tolist()

    def close(self) -> None:
        with self._lock.hold():
            self._llm.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Tokenizer:
    """The model's tokenizer alone: a vocab-only load (no weights, no context; ~35 ms, +6 MB RSS beside
    llama_cpp's own ~40 MB), for counting tokens where nothing is embedded (the worker's per-chunk
    `text_tokens`, kdbl_worker.token_counts). Counts equal `Embedder.count_tokens` (no [CLS]/[SEP]).
    Thread-safe: one reusable token buffer behind a lock (SciFact: 0.06 s per MB of text)."""

    def __init__(self, model_path: str | Path) -> None:
        self._lib = lib = llama_loader.require()
        path = Path(model_path).expanduser()
        if not path.is_file():
            raise ConfigError(f"embedding model not found: {path}", data={"model_path": str(path)})
        try:
            self._model = llama_loader.load_vocab(path)  # one load at a time: see Embedder
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot load the tokenizer of {path}: {exc}") from exc
        self._lock = threading.Lock()
        self._buffer = (lib.llama_token * 4096)()

    def count(self, text: str) -> int:
        """How many tokens `text` is (a WordPiece token spans at least one byte: len(bytes) bounds it)."""
        data = text.encode("utf-8")
        with self._lock:
            for _ in range(2):
                if len(data) + 8 > len(self._buffer):
                    self._buffer = (self._lib.llama_token * (len(data) + 8))()
                n = self._lib.llama_tokenize(self._model.vocab, data, len(data), self._buffer,
                                             len(self._buffer), False, False)
                if n >= 0:
                    return n
                self._buffer = (self._lib.llama_token * -n)()  # llama.cpp says how many it needs
        return -n

    def close(self) -> None:
        with self._lock:
            self._model.close()
