"""Rate limits and the sign-in throttle shared by every replica, in Redis (or Valkey).

Each check is one Lua script reading the time from the Redis server (`TIME`), so the replicas need no
synchronised clocks and two replicas cannot both spend the last token:

- `<prefix>rl:<key>`      hash `{tokens, updated}`: a token bucket (`RATELIMIT_RPS`, `RATELIMIT_BURST`),
  expiring once it would be full again.
- `<prefix>signin:<key>`  sorted set of failed attempts scored by time: the sliding window of the
  sign-in throttle, expiring with the window.

**Failure direction.** When the store does not answer (connection refused, 250 ms timeout) the check
falls back to this replica's own in-memory limiter and logs a warning once per outage: the limits then
hold per replica (so a cluster of N replicas lets through at most N times the limit) instead of
refusing every request or letting every request through. Redis is tried again 2 s later.
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Any

from redis import asyncio as aioredis
from redis.exceptions import RedisError

from caiplatform.ratelimit import SlidingWindowThrottle, TokenBucketLimiter

log = logging.getLogger(__name__)

STORE_TIMEOUT_SECONDS = 0.25
RETRY_AFTER_OUTAGE_SECONDS = 2.0

_BUCKET = """
local rate, burst, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = tonumber(state[1]) or burst
local updated = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - updated) * rate)
local wait = 0
if tokens >= cost then tokens = tokens - cost else wait = (cost - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'updated', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""

_WINDOW_CHECK = """
local limit, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < limit then return '' end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tostring(window - (now - tonumber(oldest[2])))
"""

_WINDOW_HIT = """
local window = tonumber(ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
return 1
"""


class _SharedStore:
    """One Redis client with the outage bookkeeping both limiters share."""

    def __init__(self, url: str, prefix: str):
        self.prefix = prefix
        self.client: Any = aioredis.Redis.from_url(
            url, socket_timeout=STORE_TIMEOUT_SECONDS, socket_connect_timeout=STORE_TIMEOUT_SECONDS,
            decode_responses=True,
        )
        self._down_until = 0.0
        self._scripts: dict[str, Any] = {}

    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def failed(self, what: str, exc: Exception) -> None:
        if self.available():
            log.warning("%s: the shared store did not answer (%s); this replica enforces its own limits "
                        "until it does", what, exc)
        self._down_until = time.monotonic() + RETRY_AFTER_OUTAGE_SECONDS

    async def run(self, source: str, key: str, *args: Any) -> Any:
        script = self._scripts.get(source)
        if script is None:
            script = self._scripts[source] = self.client.register_script(source)
        return await script(keys=[self.prefix + key], args=list(args))

    async def close(self) -> None:
        await self.client.aclose()


class RedisTokenBucketLimiter:
    """`TokenBucketLimiter`'s `acquire`, counted for the whole cluster."""

    def __init__(self, store: _SharedStore, rate_per_second: float, burst: int, fallback: TokenBucketLimiter):
        self.store = store
        self.rate = float(rate_per_second)
        self.burst = max(1, int(burst))
        self.fallback = fallback

    def try_acquire(self, key: str, cost: float = 1.0) -> float | None:
        """The local bucket alone (callers without an event loop)."""
        return self.fallback.try_acquire(key, cost)

    async def acquire(self, key: str, cost: float = 1.0) -> float | None:
        if self.rate <= 0:
            return None
        if self.store.available():
            try:
                wait = float(await self.store.run(_BUCKET, f"rl:{key}", self.rate, self.burst, cost))
            except (RedisError, OSError) as exc:
                self.store.failed("rate limit", exc)
            else:
                return wait if wait > 0 else None
        return self.fallback.try_acquire(key, cost)


class RedisSlidingWindowThrottle:
    """`SlidingWindowThrottle`'s `check` and `record`, counted for the whole cluster."""

    def __init__(self, store: _SharedStore, limit: int, window_seconds: float, fallback: SlidingWindowThrottle):
        self.store = store
        self.limit = limit
        self.window = window_seconds
        self.fallback = fallback

    async def check(self, key: str) -> float | None:
        if self.store.available():
            try:
                wait = await self.store.run(_WINDOW_CHECK, f"signin:{key}", self.limit, self.window)
            except (RedisError, OSError) as exc:
                self.store.failed("sign-in throttle", exc)
            else:
                return float(wait) if wait else None
        return self.fallback.retry_after(key)

    async def record(self, key: str) -> None:
        # Counted locally too, so an outage starts from what this replica saw rather than from zero.
        self.fallback.hit(key)
        if self.store.available():
            try:
                await self.store.run(_WINDOW_HIT, f"signin:{key}", self.window, secrets.token_hex(8))
            except (RedisError, OSError) as exc:
                self.store.failed("sign-in throttle", exc)


def shared_store(url: str, prefix: str) -> _SharedStore:
    return _SharedStore(url, prefix)
