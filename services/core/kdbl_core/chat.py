"""A local GGUF chat model through llama.cpp (llama-cpp-python), for the `answer` tool's abstractive answers.

One `ChatModel` owns one llama.cpp context (not thread-safe: one generation at a time, under a lock; a
second caller is refused while one runs, see `stream`). `generate()` runs in a worker
thread and checks, between tokens, a stop flag (the caller cancelled, or the client went away) and a
deadline (KDBL_CHAT_TIMEOUT_S): a stopped generation ends after at most the one token in flight, and its
`Generation` says how many tokens came after the stop was asked for (tests measure that: at most 1). The
model's own chat template (the GGUF's `tokenizer.chat_template`) formats the messages; nothing is ever
downloaded: KDBL_CHAT_MODEL_PATH names a file on disk (the airgap bundle's chat slot). It is loaded by
`kdbl_core.llama_loader`, as the embedding model is: one load at a time in a process.

`stream()` is the event loop's face: the generation runs in a thread (anyio.to_thread), each piece of
text comes back through a memory stream to an async callback (the MCP progress notifications), and a
cancellation of the calling task sets the stop flag before it waits for the thread, so the thread always
ends. Measured with the tests' tiny model (tests/chat_model.py, 2 layers x 64, 2 threads) on the shared
2 cores: 333 tokens/s decoding, 106 tokens/s with its ~3,900-token prompt (docs/benchmarks.md); a real
1-3 B instruct model at q4 decodes at a few to ~15 tokens/s there.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.from_thread
import anyio.to_thread

from kdbl_core import llama_loader
from kdbl_core.errors import ConfigError, RateLimited

log = logging.getLogger(__name__)

# Low temperature: an answer should stay close to the passages' words (greedy decoding loops on small models).
TEMPERATURE = 0.2


@dataclass(frozen=True, slots=True)
class Generation:
    """What one generation did: its text, tokens, why it ended ("stop": the model ended it, "length":
    max_tokens, "timeout", "cancelled"), tokens generated after the stop was asked for, and its time."""

    text: str
    tokens: int
    finish_reason: str
    tokens_after_stop: int
    seconds: float
    first_token_seconds: float | None = None  # the prompt's evaluation, mostly

    @property
    def decode_tokens_per_second(self) -> float:
        """Tokens per second after the first (the prompt's evaluation left out)."""
        if self.first_token_seconds is None or self.tokens < 2 or self.seconds <= self.first_token_seconds:
            return 0.0
        return (self.tokens - 1) / (self.seconds - self.first_token_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


class StopFlag(threading.Event):
    """A threading.Event that remembers when it was set (time.monotonic()): tokens after it were wasted."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = time.monotonic()
        super().set()


class ChatModel:
    def __init__(self, path: str | Path, *, n_ctx: int = 4096, n_threads: int = 2) -> None:
        llama_loader.require()
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"chat model not found: {path} (KDBL_CHAT_MODEL_PATH)")
        try:
            self._llm = llama_loader.load_model(str(path), n_ctx=n_ctx, n_threads=n_threads,
                                                n_threads_batch=n_threads, verbose=False)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"chat model {path} could not be loaded: {exc}") from None
        self.model_id = path.name
        self.n_ctx = n_ctx
        self._lock = threading.Lock()
        self._reserved = False  # a stream() in this event loop holds the model
        self.last: Generation | None = None  # the latest generation (tests and benchmarks read it)

    def count_tokens(self, text: str) -> int:
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def generate(self, messages: Sequence[dict[str, str]], *, max_tokens: int, on_text: Callable[[str], None],
                 stop: StopFlag, deadline: float) -> Generation:
        """Blocking: generates under the lock, calling `on_text` with each piece of text, until the model
        ends, `max_tokens`, the `deadline` (time.monotonic()) or `stop`."""
        with self._lock:
            started = time.monotonic()
            pieces: list[str] = []
            token_times: list[float] = []
            reason = "stop"
            if stop.is_set():
                reason = "cancelled"
            elif started >= deadline:
                reason = "timeout"
            else:
                chunks = self._llm.create_chat_completion(list(messages), max_tokens=max_tokens, stream=True,
                                                          temperature=TEMPERATURE)
                try:
                    for chunk in chunks:
                        choice = chunk["choices"][0]
                        piece = choice["delta"].get("content")
                        if piece:
                            token_times.append(time.monotonic())
                            pieces.append(piece)
                            on_text(piece)
                        if choice.get("finish_reason"):
                            reason = "length" if choice["finish_reason"] == "length" else "stop"
                            break
                        if stop.is_set():  # between tokens: the caller went away
                            reason = "cancelled"
                            break
                        if time.monotonic() >= deadline:
                            reason = "timeout"
                            break
                finally:
                    chunks.close()  # ends llama.cpp's generator: no token after this one
            tokens = len(token_times)
            if tokens >= max_tokens and reason == "stop":
                reason = "length"
            after_stop = sum(t > stop.at for t in token_times) if stop.at is not None else 0
            first = token_times[0] - started if token_times else None
            done = Generation("".join(pieces), tokens, reason, after_stop, time.monotonic() - started, first)
            self.last = done
        log.info("chat generation", extra={"tokens": done.tokens, "finish_reason": done.finish_reason,
                                           "seconds": round(done.seconds, 3)})
        return done

    async def stream(self, messages: Sequence[dict[str, str]], *, max_tokens: int, timeout_s: float,
                     on_text: Callable[[str], Awaitable[None]]) -> Generation:
        """generate() in a worker thread, off the event loop; each piece of text is awaited through
        `on_text` in order. Cancelling the calling task stops the generation between tokens.

        One at a time: while a generation runs, another call is refused at once (RateLimited, retry after
        a second) instead of queueing, since a waiting call would hold its database connection."""
        if self._reserved:
            raise RateLimited(1, "the chat model is busy with another answer; retry shortly")
        self._reserved = True
        try:
            return await self._stream(messages, max_tokens=max_tokens, timeout_s=timeout_s, on_text=on_text)
        finally:
            self._reserved = False

    async def _stream(self, messages: Sequence[dict[str, str]], *, max_tokens: int, timeout_s: float,
                      on_text: Callable[[str], Awaitable[None]]) -> Generation:
        stop = StopFlag()
        deadline = time.monotonic() + timeout_s
        send, receive = anyio.create_memory_object_stream[str](math.inf)
        result: list[Generation] = []

        def deliver(piece: str) -> None:  # in the worker thread: the stream is the event loop's, reached through it
            try:
                anyio.from_thread.run_sync(send.send_nowait, piece)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                stop.set()  # the caller stopped reading (cancelled): stop before the next token

        def produce() -> None:
            try:
                result.append(self.generate(messages, max_tokens=max_tokens, stop=stop, deadline=deadline,
                                            on_text=deliver))
            finally:
                anyio.from_thread.run_sync(send.close)

        async def run() -> None:
            await anyio.to_thread.run_sync(produce)

        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            try:
                async with receive:
                    async for piece in receive:
                        await on_text(piece)
            finally:
                stop.set()  # a cancelled caller: the thread ends at its next token, and the group waits for it
        return result[0]

    def idle(self, timeout: float) -> bool:
        """Waits until no generation runs (at most `timeout` seconds); whether it is idle."""
        if not self._lock.acquire(timeout=timeout):
            return False
        self._lock.release()
        return True

    def close(self) -> None:
        self._llm.close()
