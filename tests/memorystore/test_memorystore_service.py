"""MemoryStoreService rules over the in-memory provisioner: validation, roles, credential, stats, paging."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass

import anyio
import pytest

from caiplatform.adapters.memory.memorystore import InMemoryProvisioner
from caiplatform.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    Unavailable,
)
from caiplatform.models.memorystore import MemoryStore, MemoryStoreCreate, MemoryStoreCreated
from caiplatform.ports.memorystore import ProvisionerHealth
from caiplatform.services.memorystore import POLICY_RULE, SIZE_CLASS_RULE, MemoryStoreService


@pytest.fixture
async def env(platform, users, clock):
    return Env(platform.memorystores, users.project_id, clock, platform.memorystores.provisioner,
               users.member, users.admin, users.stranger, platform)


@dataclass
class Env:
    service: MemoryStoreService
    pid: str
    clock: object
    provisioner: InMemoryProvisioner
    member: object
    admin: object
    stranger: object
    platform: object


async def test_create_defaults_and_one_time_credential(env):
    service, pid = env.service, env.pid
    created = await service.create(env.member, pid, MemoryStoreCreate(name="cache"))
    assert isinstance(created, MemoryStoreCreated)
    assert (created.memorystore.name, created.memorystore.state, created.memorystore.ready) == (
        "cache", "Provisioning", False)
    cred = created.credential
    assert cred.username == "default"
    assert len(base64.urlsafe_b64decode(cred.password + "==")) == 24
    assert cred.password in cred.uri and cred.uri.startswith("redis://default:")
    assert cred.external_uri is None and "external_uri" not in created.to_json()["credential"]
    assert created.note

    instance = await service.get(env.member, pid, "cache")
    assert isinstance(instance, MemoryStore) and instance.ready and instance.connection.port > 0
    got = instance.to_json()
    assert cred.password not in json.dumps(got)
    assert "password" not in json.dumps(got)
    assert got["state"] == "Ready" and got["ready"] is True
    assert got["size_class"] == "small" and got["maxmemory_policy"] == "noeviction"
    assert got["persistence"] == {"enabled": True, "size": "2Gi"}
    assert got["memory_limit"] == "256Mi" and got["maxmemory"] == "192Mi"
    assert got["replicas"] == 1 and got["ready_replicas"] == 1
    assert got["reachable_scope"] == "vpc"
    assert got["external_exposure"] is False and got["externally_reachable"] is False
    assert "external_endpoint" not in got and "version" not in got
    assert got["connection"]["username"] == "default"
    assert got["connection"]["credential_secret"] == "ms-cache-credential"
    assert got["resource_path"].endswith("/memorystores/cache") and got["project_id"] == pid
    assert [c["type"] for c in got["conditions"]] == ["CredentialReady", "ServiceReady", "WorkloadReady", "Ready"]
    assert got["created_at"].endswith("Z")


@pytest.mark.parametrize(
    ("size_class", "limit", "cap"), [("small", "256Mi", "192Mi"), ("medium", "1Gi", "768Mi"), ("large", "4Gi", "3Gi")]
)
async def test_size_classes(env, size_class, limit, cap):
    service, pid = env.service, env.pid
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "sized", "size_class": size_class}))
    got = (await service.get(env.member, pid, "sized")).to_json()
    assert (got["size_class"], got["memory_limit"], got["maxmemory"]) == (size_class, limit, cap)


async def test_persistence_off_only_when_sent_false(env):
    service, pid = env.service, env.pid
    cases = {"a": {}, "b": {"persistence": {}}, "c": {"persistence": {"enabled": None}},
             "d": {"persistence": {"enabled": False}}, "e": {"persistence": None}}
    for name, extra in cases.items():
        await service.create(env.member, pid, MemoryStoreCreate.parse({"name": name, **extra}))
    enabled = {n: (await service.get(env.member, pid, n)).persistence.enabled for n in cases}
    assert enabled == {"a": True, "b": True, "c": True, "d": False, "e": True}


async def test_exposure_condition_and_no_external_uri(env):
    service, pid = env.service, env.pid
    body = (await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "exposed", "external_exposure": True}))).to_json()
    assert "external_uri" not in body["credential"]
    got = (await service.get(env.member, pid, "exposed")).to_json()
    assert got["external_exposure"] is True and got["externally_reachable"] is False
    assert "external_endpoint" not in got
    exposed = [c for c in got["conditions"] if c["type"] == "ExternallyReachable"]
    assert exposed and exposed[0]["status"] == "False"


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"name": "x", "size_class": "huge"}, 400, SIZE_CLASS_RULE),
        ({"name": "x", "sizeClass": "tiny"}, 400, SIZE_CLASS_RULE),
        ({"name": "x", "size_class": 3}, 400, SIZE_CLASS_RULE),
        ({"name": "x", "maxmemory_policy": "lru"}, 400, POLICY_RULE),
        ({}, 400, "name is required"),
        ({"name": ""}, 400, "name is required"),
        ({"name": "Upper"}, 400, None),
        ({"name": "1abc"}, 400, None),
        ({"name": "abc-"}, 400, None),
        ({"name": "a" * 41}, 400, None),
        ({"name": 7}, 400, None),
        ({"name": "x", "external_exposure": "yes"}, 400, None),
        ({"name": "x", "persistence": {"enabled": "no"}}, 400, None),
        ({"name": "x", "persistence": {"size": "lots"}}, 400, None),
        ({"name": "x", "version": "1.0"}, 400, None),
        ([1, 2], 400, "invalid JSON body: "),
    ],
)
async def test_create_validation(env, body, status, message):
    service, pid = env.service, env.pid
    with pytest.raises(BadRequest) as info:
        await service.create(env.member, pid, MemoryStoreCreate.parse(body))
    assert info.value.status == status
    if message is not None:
        assert info.value.message.startswith(message)


def test_policy_message_lists_every_policy():
    assert POLICY_RULE == (
        "maxmemoryPolicy must be one of noeviction, allkeys-lru, allkeys-lfu, allkeys-random, "
        "volatile-lru, volatile-lfu, volatile-random, volatile-ttl"
    )


async def test_name_limits_and_raw_body(env):
    service, pid = env.service, env.pid
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "a" * 40}))
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "b"}))
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "a-1", "version": "", "maxmemory_policy": "volatile-ttl"}))
    with pytest.raises(Conflict):
        await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "b"}))


async def test_default_version_accepted_and_reported(env):
    service, pid, provisioner = env.service, env.pid, env.provisioner
    version = provisioner.versions()[0]
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "pinned", "version": version}))
    assert (await service.get(env.member, pid, "pinned")).version == version


async def test_not_yours_is_404_and_admin_routes_are_403_for_members(env):
    service, pid = env.service, env.pid
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "cache"}))
    for call in (service.get, service.stats, service.delete, service.rotate_credential):
        with pytest.raises(NotFound):
            await call(env.stranger, pid, "cache")
        with pytest.raises(NotFound):
            await call(env.member, str(uuid.uuid4()), "cache")
    with pytest.raises(NotFound):
        await service.get(env.member, pid, "missing")
    with pytest.raises(NotFound):
        await service.get(env.member, pid, "Bad_Name")
    with pytest.raises(Forbidden):
        await service.delete(env.member, pid, "cache")
    with pytest.raises(Forbidden):
        await service.rotate_credential(env.member, pid, "cache")
    with pytest.raises(NotFound):
        await service.list(env.stranger, pid)
    with pytest.raises(NotFound):
        await service.create(env.stranger, pid, MemoryStoreCreate.parse({"name": "x"}))


async def test_provisioning_instance_refuses_stats_and_rotate(env):
    service, pid, clock = env.service, env.pid, env.clock
    service.provisioner._delay = 30.0
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "slow"}))
    assert (await service.get(env.member, pid, "slow")).state == "Provisioning"
    with pytest.raises(Conflict, match="not provisioned yet"):
        await service.stats(env.member, pid, "slow")
    with pytest.raises(Conflict, match="not provisioned yet"):
        await service.rotate_credential(env.admin, pid, "slow")
    clock.advance(31)
    got = (await service.get(env.member, pid, "slow")).to_json()
    assert got["state"] == "Ready" and got["ready"] is True
    await service.stats(env.member, pid, "slow")


async def test_stats_omits_absent_fields(env):
    service, pid = env.service, env.pid
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "cache", "maxmemory_policy": "allkeys-lfu"}))
    stats = (await service.stats(env.member, pid, "cache")).to_json()
    assert stats["name"] == "cache" and stats["memorystore"].endswith("/memorystores/cache")
    assert stats["maxmemory_bytes"] == 192 * 1024 * 1024
    assert stats["maxmemory_policy"] == "allkeys-lfu"
    assert stats["db_keys"] == 0
    # fakeredis reports neither memory use nor keyspace counters: omitted, never zeroed.
    for absent in ("used_memory_bytes", "used_memory_pct", "keyspace_hits", "hit_rate", "evicted_keys"):
        assert absent not in stats
    assert stats["note"]


class SlowProvisioner(InMemoryProvisioner):
    async def info(self, project_id, name):
        await anyio.sleep(10)
        return ""


class DownProvisioner(InMemoryProvisioner):
    async def info(self, project_id, name):
        raise ConnectionRefusedError(111, "Connection refused")


def service_over(env, provisioner, **kw) -> MemoryStoreService:
    p = env.platform
    kw.setdefault("rotation_restart_delay", None)
    return MemoryStoreService(p.db, p.access, p.audit, p.clock, p.pager, provisioner, **kw)


@pytest.mark.parametrize("kind", [SlowProvisioner, DownProvisioner])
async def test_stats_unreachable_is_503(env, kind):
    provisioner = kind()
    service = service_over(env, provisioner, stats_budget=0.2)
    pid = env.pid
    try:
        await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "cache"}))
        await service.get(env.member, pid, "cache")
        with pytest.raises(Unavailable) as info:
            await service.stats(env.member, pid, "cache")
        assert info.value.message.startswith("could not reach this memorystore to read its stats; ")
    finally:
        await provisioner.close()


async def test_rotate_returns_new_credential_once(env):
    service, pid = env.service, env.pid
    created = (await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "cache"}))).to_json()
    await service.get(env.member, pid, "cache")
    rotated = (await service.rotate_credential(env.admin, pid, "cache")).to_json()
    assert rotated["password"] != created["credential"]["password"]
    assert rotated["credential"]["password"] == rotated["password"]
    assert rotated["username"] == "default" and rotated["password"] in rotated["uri"]
    assert "restart" in rotated["note"]
    got = (await service.get(env.member, pid, "cache")).to_json()
    assert rotated["password"] not in json.dumps(got)
    # Library-only restart applies it.
    restarted = (await service.restart(env.admin, pid, "cache")).to_json()
    assert restarted["state"] == "Ready"


async def test_delete(env):
    service, pid = env.service, env.pid
    await service.create(env.member, pid, MemoryStoreCreate.parse({"name": "doomed"}))
    body = (await service.delete(env.admin, pid, "doomed")).to_json()
    assert body["name"] == "doomed" and body["state"] == "Deleting"
    assert body["resource_path"].endswith("/memorystores/doomed") and body["note"]
    with pytest.raises(NotFound):
        await service.get(env.member, pid, "doomed")
    with pytest.raises(NotFound):
        await service.delete(env.admin, pid, "doomed")


async def test_list_pages_and_always_has_next_page_token(env):
    service, pid = env.service, env.pid
    empty = (await service.list(env.member, pid)).to_json()
    assert empty == {"memorystores": [], "next_page_token": ""}
    for name in ("c", "a", "b"):
        await service.create(env.member, pid, MemoryStoreCreate.parse({"name": name}))
    first = (await service.list(env.member, pid, page_size=2)).to_json()
    assert [m["name"] for m in first["memorystores"]] == ["a", "b"]
    assert first["next_page_token"]
    second = (await service.list(env.member, pid, page_size=2, page_token=first["next_page_token"])).to_json()
    assert [m["name"] for m in second["memorystores"]] == ["c"]
    assert second["next_page_token"] == ""
    whole = (await service.list(env.member, pid)).to_json()
    assert [m["name"] for m in whole["memorystores"]] == ["a", "b", "c"] and whole["next_page_token"] == ""
    for bad in (0, 201, -1):
        with pytest.raises(BadRequest, match="page_size must be between 1 and 200"):
            await service.list(env.member, pid, page_size=bad)
    with pytest.raises(BadRequest, match="page_token is invalid"):
        await service.list(env.member, pid, page_token=env.platform.pager.token("other-list", 2))
    with pytest.raises(BadRequest, match="page_token is invalid"):
        await service.list(env.member, pid, page_token="garbage")


async def test_health(env):
    service = env.service
    status, health = await service.health()
    body = health.to_json()
    assert status == 200 and body["status"] == "ok"
    assert body["checks"] == {k: {"status": "ok", **({"detail": v["detail"]} if "detail" in v else {})}
                              for k, v in body["checks"].items()}
    assert set(body["checks"]) == {"kubernetes", "memorystore_crd", "database", "session_key"}

    async def ok():
        return ProvisionerHealth("ok")

    async def down():
        raise OSError("connection refused")

    unwired = service_over(env, service.provisioner)
    status, health = await unwired.health()
    assert status == 503 and health.status == "degraded"
    assert health.checks.database.status == "unconfigured" and health.checks.database.detail
    broken = service_over(env, service.provisioner, checks={"database": down, "session_key": ok})
    status, health = await broken.health()
    assert status == 503 and health.to_json()["checks"]["database"] == {"status": "unreachable",
                                                                       "detail": "connection refused"}
