"""Server mode: an agent's harness keeps its sessions on the platform's Valkey with a user of its own.

Before, the harness was handed the platform's own Valkey URL (`CAI_SESSION_STORE = CAI_REDIS_URL`) and the
port is reachable from its sandbox, so a tenant's code could read every project's sessions there and reset
or fill the platform's sign-in throttles. Now it gets a user confined to its agent's keys and to the
commands the session store sends (`adapters/redis/session_access.py`). Against the machine's Valkey/Redis.
"""

from __future__ import annotations

import uuid

import pytest
from redis import asyncio as aioredis
from redis.exceptions import NoPermissionError, ResponseError

from caiplatform.adapters.redis.session_access import SessionAccess
from caiplatform.adapters.redis.sessions import RedisSessionStore

pytestmark = pytest.mark.engine


@pytest.fixture
async def confined(redis_url):
    project, other = str(uuid.uuid4()), str(uuid.uuid4())
    access = SessionAccess(redis_url, b"test-secret")
    await access.ensure(project, "helper")
    admin = aioredis.from_url(redis_url, decode_responses=True)
    await admin.set(f"cai:sessions:{other}:helper:s:victim", "another project's session")
    await admin.set("caiplatform:throttle:ip:127.0.0.1", "5")
    # What the harness does with its URL (harness/app.py `open_store`).
    store = RedisSessionStore(access.store_url(project, "helper"), prefix=f"cai:sessions:{project}")
    yield store, access, project, other, admin
    await store.aclose()
    for key in [k async for k in admin.scan_iter(match=f"cai:sessions:{project}:*")]:
        await admin.delete(key)
    await admin.delete(f"cai:sessions:{other}:helper:s:victim", "caiplatform:throttle:ip:127.0.0.1")
    await access.remove(project, "helper")
    await admin.aclose()


async def test_the_agents_own_user_does_everything_the_session_store_does(confined):
    store, *_ = confined
    await store.create("helper", "alice", "s-1", state={"k": 1})
    await store.append("helper", "alice", "s-1", [{"role": "user", "content": "hi"}])
    await store.append("helper", "alice", "s-2", [{"role": "user", "content": "again"}])
    session = await store.get("helper", "s-1")
    assert session is not None and session.user_id == "alice"
    assert [u.user_id for u in (await store.list_users("helper")).items] == ["alice"]
    assert {s.session_id for s in (await store.list_sessions("helper", "alice")).items} == {"s-1", "s-2"}
    assert await store.delete("helper", "s-1") is True and await store.get("helper", "s-1") is None


async def test_the_agents_user_reaches_nothing_else(confined):
    store, access, project, other, admin = confined
    client = store.client
    with pytest.raises(NoPermissionError):
        await client.get(f"cai:sessions:{other}:helper:s:victim")  # another project's session
    with pytest.raises(NoPermissionError):
        await client.get(f"cai:sessions:{project}:another-agent:s:x")  # another agent of its own project
    with pytest.raises(NoPermissionError):
        await client.set("caiplatform:throttle:ip:127.0.0.1", "0")  # the platform's sign-in throttle
    for command in (("SCAN", "0"), ("KEYS", "*"), ("FLUSHALL",), ("CONFIG", "GET", "*"), ("ACL", "LIST"),
                    ("PUBLISH", "c", "m"), ("EVAL", "return redis.call('GET', KEYS[1])", "1", "caiplatform:throttle:ip:127.0.0.1")):
        with pytest.raises((NoPermissionError, ResponseError)):
            await client.execute_command(*command)
    assert await admin.get(f"cai:sessions:{other}:helper:s:victim") == "another project's session"
    assert await admin.get("caiplatform:throttle:ip:127.0.0.1") == "5"


def test_replicas_compute_the_same_user_and_no_platform_credential_is_in_it():
    one = SessionAccess("redis://platform:s3cret@127.0.0.1:6379/0", b"shared-session-key")
    two = SessionAccess("redis://platform:s3cret@127.0.0.1:6379/0", b"shared-session-key")
    url = one.store_url("p", "helper")
    assert url == two.store_url("p", "helper") and "s3cret" not in url and "platform" not in url.split("@")[0]
    assert url.endswith("@127.0.0.1:6379/0") and url.startswith("redis://cai-sessions-p-helper:")


async def test_a_revision_carries_the_agents_own_user_never_the_platforms_url(redis_url):
    """What an agent's instance is given in server mode: its own user, as a secret variable."""
    from types import SimpleNamespace

    from caiplatform import Platform, Settings

    platform_url = redis_url.replace("redis://", "redis://platform:s3cret@", 1) if "@" not in redis_url else redis_url
    settings = Settings(CAI_ADMIN_EMAIL="admin@example.com", CAI_ADMIN_PASSWORD="correct horse battery",
                        CAI_REDIS_URL=platform_url)  # type: ignore[call-arg]
    async with Platform.in_memory(settings) as platform:
        agents = platform.agents
        record = SimpleNamespace(env={}, name="helper", image="img", project=SimpleNamespace(id="p-1", short="p1"),
                                 workload=SimpleNamespace(key="agent-p1-helper"))
        env, secret_env = agents._revision_env(record, {}, None)  # type: ignore[arg-type]
    assert "CAI_SESSION_STORE" not in env  # it carries a password: a secret variable
    store = secret_env["CAI_SESSION_STORE"]
    assert store.startswith("redis://cai-sessions-p-1-helper:") and "s3cret" not in store
    assert "CAI_SESSION_STORE" in env["CAI_SECRET_NAMES"].split(",")


async def test_a_start_makes_every_agents_user_again(redis_url):
    """A Valkey without persistence that restarted has lost the users: the platform's start makes them again
    for every agent it has."""
    from sqlalchemy import text

    from caiplatform import Platform, Settings

    settings = Settings(CAI_ADMIN_EMAIL="admin@example.com", CAI_ADMIN_PASSWORD="correct horse battery",
                        CAI_REDIS_URL=redis_url)  # type: ignore[call-arg]
    admin = aioredis.from_url(redis_url, decode_responses=True)
    async with Platform.in_memory(settings) as platform:
        project = str(uuid.uuid4())

        def seed(session) -> None:
            session.execute(text("INSERT INTO orgs (id, slug, name, created_at) VALUES ('o-su', 'o-su', 'o', '2026-01-01')"))
            session.execute(text("INSERT INTO projects (id, org_id, slug, name, short, created_at, settings)"
                                 " VALUES (:p, 'o-su', 'p-su', 'p', 'psu00001', '2026-01-01', '{}')"), {"p": project})
            session.execute(text(
                "INSERT INTO agents (id, project_id, name, kind, framework, owner_email, state, message, image,"
                " latest_revision, generation, env, config, external_url, created_at, updated_at) VALUES ('a-su', :p,"
                " 'helper', 'agent', 'langgraph', '', 'ready', '', '', '', 0, '{}', '{}', '', '2026-01-01',"
                " '2026-01-01')"), {"p": project})

        await platform.db.run(seed)
        access = platform.agents.session_access
        user = access.username(project, "helper")
        await admin.execute_command("ACL", "DELUSER", user)  # as after a restart of a Valkey without persistence
        access._ensured.clear()
        try:
            await platform.agents.ensure_session_users()
            rules = await admin.execute_command("ACL", "GETUSER", user)
            assert rules, "the start did not make the agent's user"
        finally:
            await admin.execute_command("ACL", "DELUSER", user)
            await admin.aclose()
