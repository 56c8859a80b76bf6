"""`kdbl-control up`'s background loop: named entities are read between slices of a long embedding run, so
turning them on (`source update --entities`) while 10,000 chunks embed is not left until the run ends."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from kdbl_control import up


def test_entities_are_read_between_embedding_slices_and_progress_counts_across_them(monkeypatch, capsys) -> None:
    size = 8  # up embeds in batches of at most 8 (a stop waits one batch at most)
    slice_chunks = size * up.EMBED_SLICE_BATCHES
    pending = {"chunks": 2 * slice_chunks + 5}
    calls: list[tuple] = []

    def embed_pending(pool, embedder, *, batch, stop, max_batches, progress):  # the worker's loop, simulated
        assert batch == size and max_batches == up.EMBED_SLICE_BATCHES
        count = min(pending["chunks"], batch * max_batches)
        pending["chunks"] -= count
        calls.append(("embed", count))
        progress(count)
        return count

    def extract_entities(pool, *, stop):
        calls.append(("entities",))
        return 0

    seen: list[int] = []

    class Progress:  # `up`'s progress line: told the running count
        def __init__(self, pool, model_id) -> None:
            pass

        def __call__(self, done: int) -> None:
            seen.append(done)

    monkeypatch.setattr(up.compose, "embed_pending", embed_pending)
    monkeypatch.setattr(up.compose, "extract_entities", extract_entities)
    monkeypatch.setattr(up, "EmbeddingProgress", Progress)
    up._embed(None, SimpleNamespace(model_id="m"), 32, threading.Event())
    assert calls == [("embed", slice_chunks), ("entities",), ("embed", slice_chunks), ("entities",), ("embed", 5)]
    assert seen == [slice_chunks, 2 * slice_chunks, 2 * slice_chunks + 5]  # one count across the slices
    assert f"embedded {2 * slice_chunks + 5} chunks" in capsys.readouterr().err


def test_a_stop_ends_the_embedding_between_slices(monkeypatch) -> None:
    stop = threading.Event()
    calls: list[str] = []

    def embed_pending(pool, embedder, *, batch, stop, max_batches, progress):
        calls.append("embed")
        stop.set()  # Ctrl-C during the slice: the worker's loop returns what it embedded
        return batch * max_batches

    monkeypatch.setattr(up.compose, "embed_pending", embed_pending)
    monkeypatch.setattr(up.compose, "extract_entities", lambda pool, *, stop: calls.append("entities") or 0)
    monkeypatch.setattr(up, "EmbeddingProgress", lambda pool, model_id: (lambda done: None))
    up._embed(None, SimpleNamespace(model_id="m"), 8, stop)
    assert calls == ["embed"]  # no entity pass and no second slice after the stop
