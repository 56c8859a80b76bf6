"""The one module that imports llama-cpp-python (``llama_cpp``), for both GGUF models of the core:
the embedding model (``kdbl_core.embedder``) and the answer tool's chat model (``kdbl_core.chat``).

It says whether the library is installed (``require()`` raises ConfigError naming why not), and loads
models one at a time in the process: with ``verbose=False`` llama-cpp-python silences llama.cpp's
native logging by pointing fds 1 and 2 at /dev/null (``dup2``) while it loads, and two loads at once
can leave them there for good. Every load (an embedding model, its vocabulary alone, a chat model)
goes through ``load_model`` / ``load_vocab`` here, under one lock. The import-linter contract
"llama_cpp only in kdbl_core.llama_loader" (pyproject.toml) keeps it the only importer.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from kdbl_core.errors import ConfigError

try:
    import llama_cpp
except ImportError as exc:  # pragma: no cover - depends on the installation
    llama_cpp = None
    _IMPORT_ERROR: ImportError | None = exc
else:
    _IMPORT_ERROR = None

_LOAD_LOCK = threading.Lock()


def require() -> ModuleType:
    """The ``llama_cpp`` module, or ConfigError when llama-cpp-python is not installed."""
    if llama_cpp is None:
        raise ConfigError(f"llama-cpp-python is not installed: {_IMPORT_ERROR}")
    return llama_cpp


def gpu_offload_supported() -> bool:
    """Whether this llama-cpp-python was built with a GPU backend (CUDA, Vulkan, Metal...)."""
    probe = getattr(llama_cpp, "llama_supports_gpu_offload", None)
    return bool(probe and probe())


def load_model(*args: Any, **kwargs: Any) -> Any:
    """``llama_cpp.Llama(*args, **kwargs)``, one load at a time in this process (module docstring)."""
    library = require()
    with _LOAD_LOCK:
        return library.Llama(*args, **kwargs)


def load_vocab(path: Path) -> Any:
    """The model's vocabulary alone (no weights, no context): a ``llama_cpp._internals.LlamaModel``."""
    library = require()
    from llama_cpp import _internals

    params = library.llama_model_default_params()
    params.vocab_only = True
    with _LOAD_LOCK:
        return _internals.LlamaModel(path_model=str(path), params=params, verbose=False)
