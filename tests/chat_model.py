"""A tiny GGUF chat model the tests build themselves: llama architecture, random weights, a chat template.

Nothing is downloaded: the `gguf` package writes the file (~0.5 MB, ~0.1 s). The model is noise, which is
all the `answer` tool's tests need: they check streaming, max_tokens, timeouts, cancellation and the
citation plumbing, never what it says. Its vocabulary is the SentencePiece kind llama.cpp reads
("llama"): control tokens, the printable ASCII characters and the 256 byte-fallback tokens (so any prompt
tokenizes, a character per token), and WORDS, whole-word pieces the model emits. The output matrix gives
only WORDS (and "[1]".."[3]" markers) weight: every other row is zero, so a word's logit (random, standard
deviation ~24) wins over a control or byte token (logit 0) with overwhelming odds, and the streamed text
is plain words, never a stray end-of-sequence or half a UTF-8 sequence. A generation therefore runs to
its max_tokens unless the caller stops it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
WORDS = ("the", "cell", "protein", "study", "result", "shows", "levels", "increase", "patients", "with",
         "and", "of", "in", "risk", "gene", "effect", "data", "model", "sources", "answer", "[1]", "[2]", "[3]")
N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 8192

# SentencePiece token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    tokens, scores, types = ["<unk>", "<s>", "</s>"], [0.0, 0.0, 0.0], [_UNKNOWN, _CONTROL, _CONTROL]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        scores.append(0.0)
        types.append(_BYTE)
    for c in ["▁"] + [chr(i) for i in range(33, 127)]:
        tokens.append(c)
        scores.append(-1.0)
        types.append(_NORMAL)
    for word in WORDS:
        tokens.append("▁" + word)
        scores.append(-100.0)
        types.append(_NORMAL)
    return tokens, scores, types


def build_chat_model(path: Path, *, seed: int = 17) -> Path:
    """Writes the tiny chat model to `path` (and returns it)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocabulary()
    n_vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kdbl-test-chat")
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, N_EMBD))
    for i in range(N_LAYER):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(N_EMBD, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(N_FF, N_EMBD))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(N_EMBD, N_FF))
    writer.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    output = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    output[n_vocab - len(WORDS):] = weight(len(WORDS), N_EMBD, scale=3.0)
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
