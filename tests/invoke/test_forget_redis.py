"""On Valkey/Redis (server mode), the erasure finds the session stores of a project's agents, deleted
ones included, under the harness's key prefix, and erases one user there through the platform's own user."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

from caiplatform.adapters.redis.sessions import RedisSessionStore
from caiplatform.domain.projects import ProjectRef
from caiplatform.ports.sessions import new_event
from caiplatform.services.erasures import ErasureService, open_agent_sessions


async def test_leftover_agents_and_their_sessions_on_redis(redis_url):
    project = ProjectRef(str(uuid.uuid4()), "org", "slug", "name", "short1")
    other = str(uuid.uuid4())
    prefix = f"cai:sessions:{project.id}"
    store = RedisSessionStore(redis_url, prefix=prefix)
    elsewhere = RedisSessionStore(redis_url, prefix=f"cai:sessions:{other}")
    try:
        now = store.clock.now()
        for agent, user, session in (("gone", "alice", "s1"), ("gone", "bob", "s2"), ("live", "alice", "s3")):
            await store.append(agent, user, session, [new_event("user", [{"text": "hi"}], invocation_id="i", timestamp=now)])
        await elsewhere.append("other-agent", "alice", "s9", [])
        agents = SimpleNamespace(settings=SimpleNamespace(redis_url=redis_url, data_dir="."), mode="server")
        service = ErasureService(None, None, None, agents=agents, runtime=lambda: None,  # type: ignore[arg-type]
                                 memory=lambda: None, replica_id="r", shared=True)
        assert await service._stored_session_agents(project) == ["gone", "live"]
        leftover = open_agent_sessions(redis_url, project.id, "gone")  # what the erasure opens
        assert await service._forget_sessions(leftover, "gone", "alice") == {"sessions": 1, "events": 1}
        assert [u.user_id for u in (await store.list_users("gone")).items] == ["bob"]
        assert (await elsewhere.get("other-agent", "s9")) is not None
    finally:
        await store.purge()
        await elsewhere.purge()
        await store.aclose()
        await elsewhere.aclose()
