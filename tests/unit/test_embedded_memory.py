"""The embedded server's shared_buffers: a quarter of the usable memory within 128 MB .. 8 GB, or the setting."""

from __future__ import annotations

import os

from kdbl_core.db.embedded_postgres import EmbeddedDatabase, shared_buffers_mb
from kdbl_core.settings import Settings


def test_shared_buffers_follow_the_machine_within_bounds_unless_set(monkeypatch):
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    auto = shared_buffers_mb()
    assert 128 <= auto <= 8192 and auto <= max(128, memory_mb // 4)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**16}[name])
    assert shared_buffers_mb() == 128  # 256 MB of memory: never below PostgreSQL's default
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**28}[name])
    assert auto <= shared_buffers_mb() <= 8192  # 1 TB: capped at 8 GB (or a quarter of a cgroup limit)
    assert shared_buffers_mb(256) == 256


def test_the_server_takes_the_settings_it_is_given(monkeypatch, tmp_path):
    """shared_buffers and the socket folder's parent (runtime_dir) come from the Settings the caller passes."""
    monkeypatch.setenv("KDBL_EMBEDDED_SHARED_BUFFERS_MB", "256")
    runtime = tmp_path / "run"
    runtime.mkdir()
    given = Settings(runtime_dir=str(runtime))
    db = EmbeddedDatabase(tmp_path / ("long-" * 20) / "data", settings=given)  # too long a path for a socket
    assert db._config() is given and shared_buffers_mb(given.embedded_shared_buffers_mb) == 256
    socket_dir = db._socket_dir()
    try:
        assert socket_dir.parent == runtime and socket_dir.name.startswith("kdbl-pg-")
    finally:
        socket_dir.rmdir()
