"""Per-principal token buckets (anonymous callers per IP) and the sign-in throttle, in this process.

The async methods (`acquire`, `check`, `record`) are the interface the server and the auth service use;
`caiplatform.adapters.redis.limits` implements the same ones for a whole cluster, falling back to
these classes when its store is down.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from caiplatform.clock import Clock
from caiplatform.errors import RateLimited


@dataclass
class _Bucket:
    tokens: float
    updated: float


class TokenBucketLimiter:
    def __init__(self, rate_per_second: float, burst: int, clock: Clock | None = None, max_keys: int = 100_000):
        self.rate = float(rate_per_second)
        self.burst = max(1, int(burst))
        self._clock = clock or Clock()
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._max_keys = max_keys

    def try_acquire(self, key: str, cost: float = 1.0) -> float | None:
        """Take `cost` tokens; None when allowed, else the seconds until enough tokens exist."""
        if self.rate <= 0:
            return None
        now = self._clock.monotonic()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self._max_keys:
                    self._evict_full(now)
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= cost:
                bucket.tokens -= cost
                return None
            return (cost - bucket.tokens) / self.rate

    async def acquire(self, key: str, cost: float = 1.0) -> float | None:
        return self.try_acquire(key, cost)

    def check(self, key: str) -> None:
        wait = self.try_acquire(key)
        if wait is not None:
            raise RateLimited(retry_after=wait)

    def _evict_full(self, now: float) -> None:
        # A bucket that has refilled completely carries no information; drop those first.
        for key in [k for k, b in self._buckets.items() if b.tokens + (now - b.updated) * self.rate >= self.burst]:
            del self._buckets[key]
        if len(self._buckets) >= self._max_keys:
            self._buckets.clear()


class SlidingWindowThrottle:
    """Counts attempts per key inside a window (sign-in: 10 per IP, 50 per account, per 15 minutes)."""

    def __init__(self, limit: int, window_seconds: float, clock: Clock | None = None):
        self.limit = limit
        self.window = window_seconds
        self._clock = clock or Clock()
        self._hits: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def retry_after(self, key: str) -> float | None:
        """Seconds until another attempt is allowed, or None when one is allowed now."""
        now = self._clock.monotonic()
        with self._lock:
            hits = [t for t in self._hits.get(key, []) if now - t < self.window]
            self._hits[key] = hits
            if len(hits) >= self.limit:
                return self.window - (now - hits[0])
            return None

    def hit(self, key: str) -> None:
        with self._lock:
            self._hits.setdefault(key, []).append(self._clock.monotonic())

    async def check(self, key: str) -> float | None:
        return self.retry_after(key)

    async def record(self, key: str) -> None:
        self.hit(key)
