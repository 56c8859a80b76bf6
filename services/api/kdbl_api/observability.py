"""Prometheus metrics and the rolling latency figures /capacity reports.

Metrics carry no tenant data (labels: tool, status, reason; no tenant, principal or path) and are
served only on KDBL_METRICS_PORT (`MetricsPort`), never on the API port: the cluster's Prometheus
scrapes that port, and the chart's NetworkPolicy opens it to the monitoring namespace only.
"""

from __future__ import annotations

import threading
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

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
        self.sse_sessions = Gauge("kdbl_sse_sessions", "Open legacy HTTP+SSE sessions (kdbl_api.legacy_sse)",
                                  registry=self.registry)
        self.sse_refused = Counter("kdbl_sse_refused", "Legacy SSE sessions and POSTs refused", ["reason"],
                                   registry=self.registry)
        # fair share (kdbl_api.fair_share): every tenant's call slots together, no tenant label or name
        self.slots_in_use = Gauge("kdbl_call_slots_in_use", "Cost units of the calls in flight",
                                  registry=self.registry)
        self.slots_waiting = Gauge("kdbl_call_slots_waiting", "Calls waiting for a call slot", registry=self.registry)
        self.slots_full = Gauge("kdbl_call_slots_full", "Slot sets (one per account) with every slot taken",
                                registry=self.registry)
        self.slot_wait = Histogram("kdbl_call_slot_wait_seconds", "How long calls waited for a call slot",
                                   buckets=_BUCKETS, registry=self.registry)
        self.slots_refused = Counter("kdbl_call_slots_refused", "Calls refused (429): their slots stayed taken",
                                     ["reason"], registry=self.registry)
        self.deadline_exceeded = Counter("kdbl_call_deadline_exceeded", "Calls stopped at their deadline",
                                         ["tool", "where"], registry=self.registry)
        # read replicas (kdbl_api.read_route): calls the replica did not serve, and why
        self.read_fallbacks = Counter("kdbl_read_fallbacks", "MCP calls run on the primary instead of the replica",
                                      ["reason"], registry=self.registry)
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


class MetricsPort:
    """GET /metrics on the metrics port, and nothing else there; on any other port /metrics is 404.

    One app serves both listening sockets (kdbl_api.main binds them); a request's local port
    (`scope["server"]`) tells them apart.
    """

    def __init__(self, app: ASGIApp, port: int, observability: Observability) -> None:
        self.app, self.port, self.obs = app, port, observability

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        server = scope.get("server")
        on_metrics_port = bool(self.port) and server is not None and server[1] == self.port
        if on_metrics_port and scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
            response = PlainTextResponse(self.obs.render(), media_type="text/plain; version=0.0.4")
        elif on_metrics_port or scope["path"] == "/metrics":
            response = PlainTextResponse("Not Found", status_code=404)
        else:
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)
