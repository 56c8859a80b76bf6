"""Query embeddings go before the background batch embedding that shares the model (kdbl-control up)."""

from __future__ import annotations

import threading
import time

from kdbl_core.embedder import Embedder, PriorityLock


def test_an_urgent_holder_takes_the_lock_before_ordinary_ones_that_waited_longer():
    lock, order = PriorityLock(), []
    ordinary_waiting, urgent_waiting = threading.Event(), threading.Event()

    def take(name: str, urgent: bool, waiting: threading.Event) -> None:
        waiting.set()
        with lock.hold(urgent=urgent):
            order.append(name)

    with lock.hold():
        ordinary = threading.Thread(target=take, args=("batch", False, ordinary_waiting))
        ordinary.start()
        ordinary_waiting.wait(60)
        urgent = threading.Thread(target=take, args=("query", True, urgent_waiting))
        urgent.start()
        urgent_waiting.wait(60)
        deadline = time.monotonic() + 60
        while lock._urgent_waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
    ordinary.join(60)
    urgent.join(60)
    assert order == ["query", "batch"]


def test_a_query_is_embedded_while_a_long_background_batch_is_still_running(embed_model_path):
    embedder = Embedder(embed_model_path)
    try:
        texts = [f"chunk {i}: " + "the quick brown fox jumps over the lazy dog " * 40 for i in range(48)]
        started = time.perf_counter()
        embedder.embed(texts[:8])
        per_chunk = (time.perf_counter() - started) / 8
        background = threading.Thread(target=embedder.embed, args=(texts,))
        background.start()
        deadline = time.monotonic() + 60
        while not embedder._lock._busy and time.monotonic() < deadline:
            time.sleep(0.001)
        started = time.perf_counter()
        vector = embedder.embed_query("where is the fox?")
        waited = time.perf_counter() - started
        assert background.is_alive(), "the query waited for the whole batch"
        assert len(vector) == embedder.dim
        assert waited < max(0.5, 8 * per_chunk), (waited, per_chunk)
        background.join(60)
    finally:
        embedder.close()
