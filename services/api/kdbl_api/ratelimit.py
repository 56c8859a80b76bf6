"""Per-token rate limit (token bucket, per API replica)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict


class RateLimiter:
    def __init__(self, per_minute: int, burst: int, max_keys: int = 100_000) -> None:
        self.rate = per_minute / 60.0
        self.burst = float(max(burst, 1))
        self.enabled = per_minute > 0
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._max_keys = max_keys
        self._lock = threading.Lock()

    def check(self, key: str) -> int:
        """0 when allowed, else the whole seconds to wait before the next request would pass."""
        if not self.enabled:
            return 0
        now = time.monotonic()
        with self._lock:
            tokens, stamp = self._buckets.get(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - stamp) * self.rate)
            if tokens >= 1.0:
                self._buckets[key] = (tokens - 1.0, now)
                self._buckets.move_to_end(key)
                while len(self._buckets) > self._max_keys:
                    self._buckets.popitem(last=False)
                return 0
            self._buckets[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / self.rate))
