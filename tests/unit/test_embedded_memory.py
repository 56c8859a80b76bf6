"""The embedded server's shared_buffers: a quarter of the usable memory within 128 MB .. 8 GB, or the setting."""

from __future__ import annotations

import os

from kdbl_core import settings as settings_module
from kdbl_core.db.embedded_postgres import shared_buffers_mb


def test_shared_buffers_follow_the_machine_within_bounds_unless_set(monkeypatch):
    monkeypatch.setattr(settings_module, "_current", None)
    monkeypatch.delenv("KDBL_EMBEDDED_SHARED_BUFFERS_MB", raising=False)
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    auto = shared_buffers_mb()
    assert 128 <= auto <= 8192 and auto <= max(128, memory_mb // 4)
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**16}[name])
    assert shared_buffers_mb() == 128  # 256 MB of memory: never below PostgreSQL's default
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**28}[name])
    assert auto <= shared_buffers_mb() <= 8192  # 1 TB: capped at 8 GB (or a quarter of a cgroup limit)
    monkeypatch.setenv("KDBL_EMBEDDED_SHARED_BUFFERS_MB", "256")
    monkeypatch.setattr(settings_module, "_current", None)
    assert shared_buffers_mb() == 256
