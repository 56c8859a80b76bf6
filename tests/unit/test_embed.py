"""Embedder tests against the real all-MiniLM-L6-v2 GGUF and real llama.cpp.

The model is built (or reused from the cache) by airgap/model/build_model.py. The
conversion is proven without torch: a small numpy BERT forward pass over the source
safetensors must agree with llama.cpp's output on the f16 GGUF.
"""

from __future__ import annotations

import importlib.util
import math
import time
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from kdbl_core.embedder import Embedder
from kdbl_core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _load_build_model():
    spec = importlib.util.spec_from_file_location("kdbl_build_model", ROOT / "airgap/model/build_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


bm = _load_build_model()

SENTENCES = [
    "A man is eating food.",
    "The new movie is awesome, isn't it?",
    "PostgreSQL stores the vectors; pgvector searches them.",
    "unaffable",
]


@pytest.fixture(scope="session")
def model_path() -> Path:
    return bm.ensure_model(bm.default_out_dir(), "f16")


@pytest.fixture(scope="session")
def embedder(model_path: Path) -> Embedder:
    emb = Embedder(model_path)
    yield emb
    emb.close()


@pytest.fixture(scope="session")
def source():
    lock = bm.load_lock()
    src = bm.open_source(lock, None, bm.default_out_dir())
    bm.verify_source(src, lock)
    yield src
    src.close()


# --------------------------------------------------------------------------- basics


def test_dim_and_model_id(embedder: Embedder, model_path: Path) -> None:
    assert embedder.dim == 384
    sha = bm.load_lock()["outputs"]["f16"]["sha256"]
    assert embedder.model_id == f"{model_path.name}@{sha[:12]}+h1"


def test_vectors_are_unit_norm(embedder: Embedder) -> None:
    vecs = np.array(embedder.embed(SENTENCES + [""]))
    assert vecs.shape == (len(SENTENCES) + 1, 384)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_paraphrase_closer_than_unrelated(embedder: Embedder) -> None:
    a, b, c = np.array(embedder.embed([
        "How do I reset my password?",
        "What are the steps to change a forgotten password?",
        "The tide comes in twice a day at the harbour.",
    ]))
    assert a @ b > a @ c + 0.3


def test_batching_matches_single(embedder: Embedder) -> None:
    texts = [f"chunk number {i} talks about {w}" for i, w in enumerate(["cats", "taxes", "rust", "tea"] * 20)]
    batched = np.array(embedder.embed(texts))
    single = np.array([embedder.embed([t])[0] for t in texts[:5]])
    # packing changes ggml's f16 work shapes slightly, not the result
    cos = np.sum(batched[:5] * single, axis=1)
    assert cos.min() > 0.99999, cos


def test_concurrent_callers_get_serial_results(embedder: Embedder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"ticket {i}: the {w} service is down again" for i, w in enumerate(["billing", "search", "auth"] * 4)]
    serial = np.array(embedder.embed(texts))
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = np.array(list(pool.map(lambda t: embedder.embed([t])[0], texts)))
    assert np.sum(serial * parallel, axis=1).min() > 0.99999
    assert embedder.embed([]) == []


def test_truncation_keeps_sep_and_matches_prefix(embedder: Embedder) -> None:
    pool = [w for w in ("the quick brown fox jumps over lazy dog river house music paper light "
                        "garden window table market water city north south green blue").split()
            if len(embedder.tokenize(w)) == 3]  # [CLS] w [SEP]: one token per word
    words = [pool[i * 7 % len(pool)] for i in range(5000)]
    long_text = " ".join(words)
    ids = embedder.tokenize(long_text)
    assert len(ids) == embedder.max_tokens == 256
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP]
    prefix = " ".join(words[:254])  # 254 one-token words + [CLS] + [SEP] = 256 tokens
    assert embedder.tokenize(prefix) == ids
    long_vec, prefix_vec = np.array(embedder.embed([long_text, prefix]))
    assert float(long_vec @ prefix_vec) > 0.99999


def test_query_cache_hit_is_identical_and_faster(model_path: Path) -> None:
    emb = Embedder(model_path, query_cache_size=2)
    try:
        t0 = time.perf_counter()
        first = emb.embed_query("where is the quarterly report?")
        t_miss = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = emb.embed_query("where is the quarterly report?")
        t_hit = time.perf_counter() - t0
        assert again is first
        assert t_hit < t_miss
        emb.embed_query("second")
        emb.embed_query("third")  # evicts the first (size 2)
        assert emb.embed_query("where is the quarterly report?") is not first
    finally:
        emb.close()


def test_missing_model_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        Embedder(tmp_path / "nope.gguf")


def test_max_tokens_beyond_model_context_is_config_error(model_path: Path) -> None:
    with pytest.raises(ConfigError, match="context length 512"):
        Embedder(model_path, n_batch=1024, max_tokens=1000)


def test_non_embedding_model_is_config_error(tmp_path: Path, source, monkeypatch) -> None:
    import gguf

    monkeypatch.setattr(bm, "_pooling_type", lambda src: gguf.PoolingType.NONE)
    path = tmp_path / "no-pooling.gguf"
    bm.write_gguf(source, path)
    with pytest.raises(ConfigError, match="not a sentence-embedding model"):
        Embedder(path)
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(ConfigError, match="cannot load"):
        Embedder(garbage)


# --------------------------------------------------------------------------- reference


def _wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT uncased BasicTokenizer + WordPiece, enough for plain ASCII/Latin sentences."""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    words: list[str] = []
    for chunk in text.split():
        cur = ""
        for ch in chunk:
            if unicodedata.category(ch).startswith("P") or (33 <= ord(ch) <= 47 or 58 <= ord(ch) <= 64
                                                             or 91 <= ord(ch) <= 96 or 123 <= ord(ch) <= 126):
                if cur:
                    words.append(cur)
                words.append(ch)
                cur = ""
            else:
                cur += ch
        if cur:
            words.append(cur)
    ids = [vocab["[CLS]"]]
    for word in words:
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in vocab:
                    pieces.append(vocab[piece])
                    break
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            start = end
        ids.extend(pieces)
    return ids + [vocab["[SEP]"]]


def _numpy_bert(weights: dict[str, np.ndarray], ids: list[int], n_layers: int = 6, n_heads: int = 12,
                eps: float = 1e-12) -> np.ndarray:
    """Mean-pooled, L2-normalised BertModel output in float64 (exact erf GELU)."""
    w = {k: v.astype(np.float64) for k, v in weights.items()}
    erf = np.vectorize(math.erf)

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[p + ".weight"] + w[p + ".bias"]

    def dense(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    n = len(ids)
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
         + w["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    d = x.shape[1] // n_heads
    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        q, k, v = (dense(x, p + f"attention.self.{m}").reshape(n, n_heads, d).transpose(1, 0, 2)
                   for m in ("query", "key", "value"))
        s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, -1)
        x = ln(x + dense(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = dense(x, p + "intermediate.dense")
        h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
        x = ln(x + dense(h, p + "output.dense"), p + "output.LayerNorm")
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def test_gguf_matches_numpy_reference(embedder: Embedder, source) -> None:
    from safetensors.numpy import load as st_load

    weights = st_load(source.read("model.safetensors"))
    vocab_words = source.read("vocab.txt").decode("utf-8").split("\n")
    vocab = {word: i for i, word in enumerate(vocab_words) if word}
    got = np.array(embedder.embed(SENTENCES))
    for sentence, vec in zip(SENTENCES, got, strict=True):
        ids = embedder.tokenize(sentence)
        assert ids == _wordpiece(sentence, vocab), sentence  # llama.cpp's WordPiece == BERT's
        ref = _numpy_bert(weights, ids)
        cos = float(vec @ ref)
        print(f"cosine(llama.cpp f16, numpy f64) = {cos:.6f}  {sentence!r}")
        assert cos >= 0.999, (sentence, cos)


def test_gpu_layers_on_a_cpu_build_warn_and_embed_on_the_cpu(model_path: Path, embedder: Embedder,
                                                              caplog) -> None:
    from kdbl_core import embedder as embedder_module

    assert not embedder_module.gpu_offload_supported()  # this machine's build (CI's too) is the CPU one
    with caplog.at_level("WARNING", logger="kdbl_core.embedder"):
        gpu = Embedder(model_path, gpu_layers=-1)
    try:
        assert gpu.gpu_layers == 0 and "no GPU backend" in caplog.text
        assert gpu.embed(["a GPU node"])[0] == pytest.approx(embedder.embed(["a GPU node"])[0], abs=1e-6)
    finally:
        gpu.close()
