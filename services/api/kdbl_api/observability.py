"""Prometheus metrics and the rolling latency figures /capacity reports."""

from __future__ import annotations

import threading
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Observability:
    """One registry per app instance (tests build many apps in one process)."""

    def __init__(self, window: int = 1000) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("kdbl_mcp_calls", "MCP tool/resource calls", ["tool", "status"],
                             registry=self.registry)
        self.latency = Histogram("kdbl_mcp_call_seconds", "MCP call latency", ["tool"], buckets=_BUCKETS,
                                 registry=self.registry)
        self.auth_failures = Counter("kdbl_auth_failures", "Rejected credentials", ["reason"],
                                     registry=self.registry)
        self.rate_limited = Counter("kdbl_rate_limited", "Requests refused by the rate limit",
                                    registry=self.registry)
        self.downloads = Counter("kdbl_downloads", "Signed downloads served", ["status"], registry=self.registry)
        self._window = window
        self._modes: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record_call(self, tool: str, status: str, seconds: float, mode: str | None = None) -> None:
        self.calls.labels(tool, status).inc()
        self.latency.labels(tool).observe(seconds)
        if mode is not None and status == "ok":
            with self._lock:
                self._modes.setdefault(mode, deque(maxlen=self._window)).append(seconds * 1000)

    def mode_latency(self, mode: str) -> dict[str, float | int | None]:
        with self._lock:
            values = sorted(self._modes.get(mode, ()))
        if not values:
            return {"samples": 0, "p50_ms": None, "p95_ms": None}

        def pct(p: float) -> float:
            return round(values[min(len(values) - 1, int(p * len(values)))], 2)

        return {"samples": len(values), "p50_ms": pct(0.5), "p95_ms": pct(0.95)}

    def render(self) -> bytes:
        return generate_latest(self.registry)
