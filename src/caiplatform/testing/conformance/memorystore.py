"""Conformance suite for `MemoryStoreProvisioner` adapters.

Use it from a test module that defines a `provisioner` fixture (an adapter that has been started) and a
`backend` fixture (its registry name), then imports the tests:

    from caiplatform.testing.conformance.memorystore import *  # noqa: F403

Clients connect with redis-py using the handed-out URI over RESP2 (so `AUTH` is a real command that
every adapter has to answer). Every test uses its own random project id, so suites may run in parallel
against one adapter.

The tests are plain `async def` tests, for pytest-asyncio (`asyncio_mode = "auto"`) to run in the event loop of
the `provisioner` fixture: an adapter owns tasks and server processes bound to the loop that made them, and
a test run in another loop (anyio's runner, with `pytest.mark.anyio`) left a launch task that its fixture's
loop could never finish cancelling (a teardown hung until pytest-timeout).
"""

from __future__ import annotations

import secrets
import sys
import time
import uuid

import anyio
import pytest

from caiplatform.domain.memorystore import SIZE_CLASSES, InstanceSpec, State, connection_uri, stats_from_info
from caiplatform.errors import Conflict
from caiplatform.ports.memorystore import MemoryStoreProvisioner

__all__ = [
    "test_create_starts_provisioning_then_ready",
    "test_create_duplicate_name_conflicts",
    "test_list_is_sorted_and_scoped_to_project",
    "test_uri_connects_writes_and_reads",
    "test_wrong_password_is_refused",
    "test_unauthenticated_commands_are_refused",
    "test_rotation_keeps_old_password_until_restart",
    "test_persistence_survives_restart",
    "test_without_persistence_restart_starts_empty",
    "test_info_reports_size_class_cap_and_policy",
    "test_info_counts_keys",
    "test_info_hit_rate_after_lookup",
    "test_info_used_memory_pct",
    "test_eviction_policy_is_enforced",
    "test_delete_destroys_instance_and_data",
    "test_health_checks_pass",
]

notimpl = pytest.mark.notimpl


def apply_notimpl(request: pytest.FixtureRequest, backend: str) -> None:
    """Turn `notimpl([backends], reason=...)` into a strict xfail for the named backends.

    Strict, so a gap that gets closed makes the run fail until the mark is removed.
    """
    for mark in request.node.iter_markers("notimpl"):
        backends = mark.args[0] if mark.args else mark.kwargs.get("backends", [])
        if backend in backends:
            reason = mark.kwargs.get("reason", "not implemented")
            request.applymarker(pytest.mark.xfail(strict=True, reason=f"notimpl[{backend}]: {reason}"))


def spec(name: str | None = None, **kw) -> InstanceSpec:
    project = kw.pop("project_id", str(uuid.uuid4()))
    return InstanceSpec(project_id=project, project_short=project[:8], name=name or f"ms-{secrets.token_hex(3)}", **kw)


def password() -> str:
    return secrets.token_urlsafe(24)


async def wait_ready(p: MemoryStoreProvisioner, s: InstanceSpec, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        inst = await p.get(s.project_id, s.name)
        assert inst is not None
        if inst.ready:
            return inst
        if time.monotonic() > deadline:
            raise AssertionError(f"{s.name} not ready after {timeout} s: {inst.state} {inst.message}")
        await anyio.sleep(0.05)


def no_retry():
    """redis-py retries connection errors (AuthenticationError is one) with backoff by default."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def client(inst, pw: str):
    import redis

    return redis.Redis.from_url(connection_uri(inst.host, inst.port, pw), protocol=2, socket_timeout=5, retry=no_retry())


def refused(inst, pw: str | None) -> bool:
    import redis

    c = client(inst, pw) if pw else redis.Redis(host=inst.host, port=inst.port, protocol=2, socket_timeout=5,
                                                    retry=no_retry())
    try:
        c.get("probe")
    except (redis.AuthenticationError, redis.ResponseError) as exc:
        assert "auth" in str(exc).lower() or "password" in str(exc).lower(), exc
        return True
    finally:
        c.close()
    return False


async def provisioned(p: MemoryStoreProvisioner, **kw):
    s = spec(**kw)
    pw = password()
    await p.create(s, pw)
    inst = await wait_ready(p, s)
    return s, pw, inst


async def test_create_starts_provisioning_then_ready(provisioner):
    s = spec()
    created = await provisioner.create(s, password())
    assert created.state is State.PROVISIONING and not created.ready
    assert created.spec == s
    inst = await wait_ready(provisioner, s)
    assert inst.state is State.READY and inst.ready
    # Document 3: `connection` is `host` and port 6379. On one machine each instance has its own
    # loopback address (never 127.0.0.1, where the machine's own Redis may listen); only a system that
    # cannot bind another loopback address falls back to 127.0.0.1 and a free port, and says so.
    if inst.note:
        assert sys.platform != "linux", "on Linux the whole 127.0.0.0/8 range is local: no fallback"
        assert inst.host == "127.0.0.1" and inst.port != 6379 and "6379" in inst.note
    else:
        assert inst.port == 6379 and inst.host not in ("127.0.0.1", "localhost")  # a cluster names a Service
        assert inst.to_json()["connection"] == {
            "host": inst.host, "port": 6379, "username": "default", "credential_secret": s.credential_secret,
        }
    kinds = [c.type for c in inst.conditions()]
    assert kinds == ["CredentialReady", "ServiceReady", "WorkloadReady", "Ready"]
    assert all(c.status == "True" for c in inst.conditions())
    await provisioner.delete(s.project_id, s.name)


async def test_create_duplicate_name_conflicts(provisioner):
    s = spec()
    await provisioner.create(s, password())
    with pytest.raises(Conflict):
        await provisioner.create(s, password())
    # The same name in another project is a different instance.
    other = spec(name=s.name)
    await provisioner.create(other, password())
    await provisioner.delete(s.project_id, s.name)
    await provisioner.delete(other.project_id, other.name)


async def test_list_is_sorted_and_scoped_to_project(provisioner):
    project = str(uuid.uuid4())
    names = ["zeta", "alpha", "mid"]
    for n in names:
        await provisioner.create(spec(n, project_id=project), password())
    await provisioner.create(spec("alpha"), password())  # another project
    listed = await provisioner.list(project)
    assert [i.spec.name for i in listed] == sorted(names)
    assert await provisioner.list(str(uuid.uuid4())) == []
    for n in names:
        await provisioner.delete(project, n)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_uri_connects_writes_and_reads(provisioner):
    s, pw, inst = await provisioned(provisioner)
    c = client(inst, pw)
    try:
        assert c.set("greeting", "hello")
        assert c.get("greeting") == b"hello"
        assert c.incr("counter") == 1
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_wrong_password_is_refused(provisioner):
    s, pw, inst = await provisioned(provisioner)
    assert refused(inst, "not-the-password")
    assert not refused(inst, pw)
    await provisioner.delete(s.project_id, s.name)


@notimpl(["memory"], reason="fakeredis runs commands of a connection that never sent AUTH")
@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_unauthenticated_commands_are_refused(provisioner):
    s, pw, inst = await provisioned(provisioner)
    assert refused(inst, None)
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_rotation_keeps_old_password_until_restart(provisioner):
    s, old, inst = await provisioned(provisioner)
    c = client(inst, old)
    c.set("kept", "yes")
    c.close()
    new = password()
    rotated = await provisioner.rotate_password(s.project_id, s.name, new)
    assert rotated.ready
    assert not refused(inst, old), "the previous password must stay in force until restart"
    assert refused(inst, new), "the new password must not work before restart"
    await provisioner.restart(s.project_id, s.name)
    inst = await wait_ready(provisioner, s)
    assert refused(inst, old)
    c = client(inst, new)
    try:
        assert c.get("kept") == b"yes"
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_persistence_survives_restart(provisioner):
    s, pw, inst = await provisioned(provisioner, persistence_enabled=True)
    c = client(inst, pw)
    c.set("durable", "value")
    c.close()
    await provisioner.restart(s.project_id, s.name)
    inst = await wait_ready(provisioner, s)
    c = client(inst, pw)
    try:
        assert c.get("durable") == b"value"
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_without_persistence_restart_starts_empty(provisioner):
    s, pw, inst = await provisioned(provisioner, persistence_enabled=False)
    c = client(inst, pw)
    c.set("volatile", "value")
    c.close()
    await provisioner.restart(s.project_id, s.name)
    inst = await wait_ready(provisioner, s)
    c = client(inst, pw)
    try:
        assert c.get("volatile") is None
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
@pytest.mark.parametrize("size_class", ["small", "medium", "large"])
async def test_info_reports_size_class_cap_and_policy(provisioner, size_class):
    s, pw, inst = await provisioned(provisioner, size_class=size_class, maxmemory_policy="allkeys-lru")
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert stats["maxmemory_bytes"] == SIZE_CLASSES[size_class].maxmemory_bytes
    assert stats["maxmemory_bytes"] == {"small": 192, "medium": 768, "large": 3072}[size_class] * 1024 * 1024
    assert stats["maxmemory_policy"] == "allkeys-lru"
    assert stats["uptime_in_seconds"] >= 0
    assert stats["connected_clients"] >= 0
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_info_counts_keys(provisioner):
    s, pw, inst = await provisioned(provisioner)
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert stats["db_keys"] == 0
    c = client(inst, pw)
    c.mset({"a": 1, "b": 2, "c": 3})
    c.close()
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert stats["db_keys"] == 3
    for absent_is_omitted in stats.values():
        assert absent_is_omitted is not None
    await provisioner.delete(s.project_id, s.name)


@notimpl(["memory"], reason="fakeredis keeps no keyspace hit/miss counters, so hit_rate is always omitted")
@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_info_hit_rate_after_lookup(provisioner):
    s, pw, inst = await provisioned(provisioner)
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert "hit_rate" not in stats, "no lookup yet: hit_rate must be omitted"
    c = client(inst, pw)
    c.set("k", "v")
    c.get("k")
    c.get("missing")
    c.get("k")
    c.close()
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert stats["keyspace_hits"] == 2 and stats["keyspace_misses"] == 1
    assert stats["hit_rate"] == pytest.approx(2 / 3, abs=1e-3)
    await provisioner.delete(s.project_id, s.name)


@notimpl(["memory"], reason="fakeredis reports no used_memory, so used_memory_pct is omitted")
@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_info_used_memory_pct(provisioner):
    s, pw, inst = await provisioned(provisioner)
    stats = stats_from_info(s, await provisioner.info(s.project_id, s.name))
    assert stats["used_memory_bytes"] > 0 and stats["used_memory_human"]
    assert 0 < stats["used_memory_pct"] < 100
    assert stats["total_commands_processed"] >= 1
    await provisioner.delete(s.project_id, s.name)


@notimpl(["memory"], reason="fakeredis does not enforce maxmemory")
@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_eviction_policy_is_enforced(provisioner):
    import redis

    s, pw, inst = await provisioned(provisioner, maxmemory_policy="noeviction")
    c = client(inst, pw)
    blob = b"x" * (4 * 1024 * 1024)
    try:
        with pytest.raises(redis.ResponseError, match="maxmemory"):
            for i in range(60):  # 240 MiB > the small class's 192Mi cap
                c.set(f"blob{i}", blob)
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


@notimpl(["kubernetes"], reason="clients reach Valkey at its Service address inside the cluster; the API emulator runs no pods")
async def test_delete_destroys_instance_and_data(provisioner):
    import redis

    s, pw, inst = await provisioned(provisioner)
    c = client(inst, pw)
    c.set("doomed", "1")
    c.close()
    deleted = await provisioner.delete(s.project_id, s.name)
    assert deleted is not None and deleted.state is State.DELETING
    assert await provisioner.get(s.project_id, s.name) is None
    assert await provisioner.delete(s.project_id, s.name) is None
    c = client(inst, pw)
    with pytest.raises((redis.ConnectionError, redis.AuthenticationError, redis.TimeoutError)):
        c.get("doomed")
    c.close()
    # The same name again is a new, empty instance.
    pw2 = password()
    await provisioner.create(s, pw2)
    inst2 = await wait_ready(provisioner, s)
    c = client(inst2, pw2)
    try:
        assert c.get("doomed") is None
    finally:
        c.close()
    await provisioner.delete(s.project_id, s.name)


async def test_health_checks_pass(provisioner):
    checks = await provisioner.health()
    assert set(checks) >= {"kubernetes", "memorystore_crd"}
    assert all(c.ok for c in checks.values()), checks
