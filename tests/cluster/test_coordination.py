"""The coordination pieces on the machine's engines: Redis limits (unique key prefix) and PostgreSQL
work locks, including what each does when its engine is gone."""

from __future__ import annotations

import asyncio
import secrets

from caiplatform.adapters.redis.limits import (
    RedisSlidingWindowThrottle,
    RedisTokenBucketLimiter,
    shared_store,
)
from caiplatform.db import Database
from caiplatform.ratelimit import SlidingWindowThrottle, TokenBucketLimiter
from caiplatform.services.auth import ACCOUNT_ATTEMPTS, LOGIN_WINDOW_SECONDS
from caiplatform.testing.engines import free_port
from caiplatform.testing.polling import eventually
from caiplatform.worklocks import PostgresWorkLocks, work_locks_for


async def test_two_replicas_share_one_token_bucket(redis_url: str) -> None:
    prefix = f"cai-test-{secrets.token_hex(4)}:"
    stores = [shared_store(redis_url, prefix) for _ in range(2)]
    limiters = [RedisTokenBucketLimiter(s, 1.0, 10, TokenBucketLimiter(1.0, 10)) for s in stores]
    try:
        allowed = [await limiters[i % 2].acquire("user:u1") is None for i in range(20)]
        assert allowed.count(True) == 10  # one bucket of 10, not one per replica
        wait = await limiters[0].acquire("user:u1")
        assert wait is not None and 0 < wait <= 1.0
        assert await limiters[1].acquire("user:other") is None  # buckets are per key
    finally:
        for store in stores:
            await store.client.delete(prefix + "rl:user:u1", prefix + "rl:user:other")
            await store.close()


async def test_the_account_throttle_counts_every_replica(redis_url: str) -> None:
    prefix = f"cai-test-{secrets.token_hex(4)}:"
    stores = [shared_store(redis_url, prefix) for _ in range(2)]
    throttles = [RedisSlidingWindowThrottle(s, ACCOUNT_ATTEMPTS, LOGIN_WINDOW_SECONDS,
                                            SlidingWindowThrottle(ACCOUNT_ATTEMPTS, LOGIN_WINDOW_SECONDS))
                 for s in stores]
    try:
        for attempt in range(ACCOUNT_ATTEMPTS - 1):
            await throttles[attempt % 2].record("account:a@example.com")
        assert await throttles[0].check("account:a@example.com") is None
        await throttles[1].record("account:a@example.com")
        for throttle in throttles:
            wait = await throttle.check("account:a@example.com")
            assert wait is not None and LOGIN_WINDOW_SECONDS - 5 < wait <= LOGIN_WINDOW_SECONDS
    finally:
        await stores[0].client.delete(prefix + "signin:account:a@example.com")
        for store in stores:
            await store.close()


async def test_an_unreachable_store_falls_back_to_this_replicas_own_limits() -> None:
    store = shared_store(f"redis://127.0.0.1:{free_port()}/0", "cai-test:")
    limiter = RedisTokenBucketLimiter(store, 1.0, 3, TokenBucketLimiter(1.0, 3))
    throttle = RedisSlidingWindowThrottle(store, 2, 60, SlidingWindowThrottle(2, 60))
    try:
        assert [await limiter.acquire("k") is None for _ in range(4)] == [True, True, True, False]
        assert not store.available()  # no 250 ms wait per request during the outage
        await throttle.record("ip:x")
        await throttle.record("ip:x")
        assert await throttle.check("ip:x") is not None
    finally:
        await store.close()


async def test_a_work_lock_is_held_by_one_replica_and_freed_when_its_connection_dies(postgres_url: str) -> None:
    a, b = PostgresWorkLocks(postgres_url, "replica-a"), PostgresWorkLocks(postgres_url, "replica-b")
    try:
        assert await a.try_acquire("job:1")
        assert not await a.try_acquire("job:1")  # held: not taken twice, even by its holder
        assert not await b.try_acquire("job:1")
        assert await b.try_acquire("job:2")
        await a.release("job:1")
        assert await b.try_acquire("job:1")
        # A replica that dies takes its locks with it: here its connection is closed under it.
        assert await a.try_acquire("job:3")
        await asyncio.to_thread(a._conn.close)
        for _ in range(50):  # the server ends the session a moment after the socket closes
            if await b.try_acquire("job:3"):
                break
            await asyncio.sleep(0.05)
        assert b.holds("job:3")
        # The dead connection is replaced on the next call; the lock it lost belongs to b now.
        assert not await a.try_acquire("job:3") and not a.holds("job:3")
        # A lock nobody took while the connection was down is taken again on the new one.
        assert await a.try_acquire("job:4")
        old_session = a._conn.info.backend_pid
        await asyncio.to_thread(a._conn.close)
        await eventually(lambda: _session_ended(postgres_url, old_session),  # and its locks with it
                         "the server to end the closed connection's session")
        assert await a.try_acquire("job:5")  # reconnects, and takes job:4 again first
        assert a.holds("job:4") and not await b.try_acquire("job:4")
    finally:
        await a.close()
        await b.close()


def test_sqlite_gets_locks_of_its_own_process(tmp_path) -> None:
    db = Database.sqlite_file(tmp_path / "x.db")
    try:
        assert work_locks_for(db).shared is False
    finally:
        db.dispose()


async def _session_ended(url: str, pid: int) -> bool:
    import psycopg
    from sqlalchemy.engine import make_url

    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
        row = await (await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))).fetchone()
    return row is not None and row[0] == 0
