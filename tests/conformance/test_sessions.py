"""The session store conformance suite over the in-memory, SQLite and Redis adapters."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.clock import ManualClock
from caiplatform.testing.conformance.sessions import *  # noqa: F403


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def session_store(request, tmp_path):
    clock = ManualClock()
    if request.param == "memory":
        from caiplatform.adapters.memory.sessions import InMemorySessionStore

        store = InMemorySessionStore(clock=clock)
        yield store
    elif request.param == "sqlite":
        from caiplatform.adapters.sqlite.sessions import SQLiteSessionStore

        store = SQLiteSessionStore.in_data_dir(tmp_path, clock=clock)
        yield store
        await store.aclose()
    else:
        from caiplatform.adapters.redis.sessions import RedisSessionStore

        redis_url = request.getfixturevalue("redis_url")
        store = RedisSessionStore(redis_url, prefix=f"test-sessions-{uuid.uuid4().hex}", clock=clock)
        try:
            yield store
        finally:
            await store.purge()
            await store.aclose()
