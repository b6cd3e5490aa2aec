"""MemoryStoreService rules over the in-memory provisioner: validation, roles, credential, stats, paging."""

from __future__ import annotations

import base64
import json
import uuid

import anyio
import pytest

from caiplatform.adapters.memory.memorystore import InMemoryProvisioner
from caiplatform.clock import ManualClock
from caiplatform.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    Unavailable,
)
from caiplatform.ports.memorystore import ProvisionerHealth
from caiplatform.principal import CredentialKind, Principal, PrincipalKind
from caiplatform.services.memorystore import (
    POLICY_RULE,
    SIZE_CLASS_RULE,
    MemoryStoreService,
    ProjectRef,
)

pytestmark = pytest.mark.anyio

MEMBER = Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id="member")
ADMIN = Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id="admin")
STRANGER = Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id="stranger")


class FakeProjects:
    """Stands in for the access service: one project; `member` and `admin` belong to it."""

    def __init__(self):
        self.project = ProjectRef(id=str(uuid.uuid4()), short="p" + uuid.uuid4().hex[:7])
        self.roles = {"member": "member", "admin": "admin"}

    async def require(self, principal, project_id, *, admin=False):
        role = self.roles.get(principal.user_id or "")
        if project_id != self.project.id or role is None:
            raise NotFound("project not found")
        if admin and role != "admin":
            raise Forbidden("this action needs the project admin role")
        return self.project


class PlainPages:
    """A transparent codec that still refuses tokens issued for another list."""

    def encode(self, list_id, cursor):
        return base64.urlsafe_b64encode(json.dumps([list_id, cursor]).encode()).decode()

    def decode(self, list_id, token):
        try:
            issued_for, cursor = json.loads(base64.urlsafe_b64decode(token.encode()))
        except Exception:
            issued_for, cursor = None, None
        if issued_for != list_id:
            raise BadRequest("page_token is invalid or was issued for a different list; start from the first page")
        return cursor


@pytest.fixture
async def env():
    clock = ManualClock()
    provisioner = InMemoryProvisioner(clock=clock)
    projects = FakeProjects()
    service = MemoryStoreService(provisioner, projects, PlainPages())
    yield service, projects.project.id, clock, provisioner
    await provisioner.close()


async def test_create_defaults_and_one_time_credential(env):
    service, pid, _, _ = env
    body = await service.create(MEMBER, pid, {"name": "cache"})
    assert body["memorystore"] == {"name": "cache", "state": "Provisioning", "ready": False}
    cred = body["credential"]
    assert cred["username"] == "default"
    assert len(base64.urlsafe_b64decode(cred["password"] + "==")) == 24
    assert cred["password"] in cred["uri"] and cred["uri"].startswith("redis://default:")
    assert "external_uri" not in cred
    assert body["note"]

    got = await service.get(MEMBER, pid, "cache")
    assert cred["password"] not in json.dumps(got)
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
    service, pid, _, _ = env
    await service.create(MEMBER, pid, {"name": "sized", "size_class": size_class})
    got = await service.get(MEMBER, pid, "sized")
    assert (got["size_class"], got["memory_limit"], got["maxmemory"]) == (size_class, limit, cap)


async def test_persistence_off_only_when_sent_false(env):
    service, pid, _, _ = env
    cases = {"a": {}, "b": {"persistence": {}}, "c": {"persistence": {"enabled": None}},
             "d": {"persistence": {"enabled": False}}, "e": {"persistence": None}}
    for name, extra in cases.items():
        await service.create(MEMBER, pid, {"name": name, **extra})
    enabled = {n: (await service.get(MEMBER, pid, n))["persistence"]["enabled"] for n in cases}
    assert enabled == {"a": True, "b": True, "c": True, "d": False, "e": True}


async def test_exposure_condition_and_no_external_uri(env):
    service, pid, _, _ = env
    body = await service.create(MEMBER, pid, {"name": "exposed", "external_exposure": True})
    assert "external_uri" not in body["credential"]
    got = await service.get(MEMBER, pid, "exposed")
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
        (b"{not json", 400, "invalid JSON body: "),
        (b"[1, 2]", 400, "invalid JSON body: "),
        (b"", 400, "invalid JSON body: "),
        (json.dumps({"name": "x", "pad": "z" * 17000}).encode(), 413, None),
    ],
)
async def test_create_validation(env, body, status, message):
    service, pid, _, _ = env
    with pytest.raises((BadRequest, PayloadTooLarge)) as info:
        await service.create(MEMBER, pid, body)
    assert info.value.status == status
    if message is not None:
        assert info.value.message.startswith(message)


def test_policy_message_lists_every_policy():
    assert POLICY_RULE == (
        "maxmemoryPolicy must be one of noeviction, allkeys-lru, allkeys-lfu, allkeys-random, "
        "volatile-lru, volatile-lfu, volatile-random, volatile-ttl"
    )


async def test_name_limits_and_raw_body(env):
    service, pid, _, _ = env
    await service.create(MEMBER, pid, json.dumps({"name": "a" * 40}).encode())
    await service.create(MEMBER, pid, {"name": "b"})
    await service.create(MEMBER, pid, {"name": "a-1", "version": "", "maxmemory_policy": "volatile-ttl"})
    with pytest.raises(Conflict):
        await service.create(MEMBER, pid, {"name": "b"})


async def test_default_version_accepted_and_reported(env):
    service, pid, _, provisioner = env
    version = provisioner.versions()[0]
    await service.create(MEMBER, pid, {"name": "pinned", "version": version})
    assert (await service.get(MEMBER, pid, "pinned"))["version"] == version


async def test_not_yours_is_404_and_admin_routes_are_403_for_members(env):
    service, pid, _, _ = env
    await service.create(MEMBER, pid, {"name": "cache"})
    for call in (service.get, service.stats, service.delete, service.rotate_credential):
        with pytest.raises(NotFound):
            await call(STRANGER, pid, "cache")
        with pytest.raises(NotFound):
            await call(MEMBER, str(uuid.uuid4()), "cache")
    with pytest.raises(NotFound):
        await service.get(MEMBER, pid, "missing")
    with pytest.raises(NotFound):
        await service.get(MEMBER, pid, "Bad_Name")
    with pytest.raises(Forbidden):
        await service.delete(MEMBER, pid, "cache")
    with pytest.raises(Forbidden):
        await service.rotate_credential(MEMBER, pid, "cache")
    with pytest.raises(NotFound):
        await service.list(STRANGER, pid)
    with pytest.raises(NotFound):
        await service.create(STRANGER, pid, {"name": "x"})


async def test_provisioning_instance_refuses_stats_and_rotate(env):
    service, pid, clock, _ = env
    service.provisioner._delay = 30.0
    await service.create(MEMBER, pid, {"name": "slow"})
    assert (await service.get(MEMBER, pid, "slow"))["state"] == "Provisioning"
    with pytest.raises(Conflict, match="not provisioned yet"):
        await service.stats(MEMBER, pid, "slow")
    with pytest.raises(Conflict, match="not provisioned yet"):
        await service.rotate_credential(ADMIN, pid, "slow")
    clock.advance(31)
    got = await service.get(MEMBER, pid, "slow")
    assert got["state"] == "Ready" and got["ready"] is True
    await service.stats(MEMBER, pid, "slow")


async def test_stats_omits_absent_fields(env):
    service, pid, _, _ = env
    await service.create(MEMBER, pid, {"name": "cache", "maxmemory_policy": "allkeys-lfu"})
    stats = await service.stats(MEMBER, pid, "cache")
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


@pytest.mark.parametrize("kind", [SlowProvisioner, DownProvisioner])
async def test_stats_unreachable_is_503(kind):
    projects = FakeProjects()
    provisioner = kind()
    service = MemoryStoreService(provisioner, projects, PlainPages(), stats_budget=0.2)
    pid = projects.project.id
    try:
        await service.create(MEMBER, pid, {"name": "cache"})
        await service.get(MEMBER, pid, "cache")
        with pytest.raises(Unavailable) as info:
            await service.stats(MEMBER, pid, "cache")
        assert info.value.message.startswith("could not reach this memorystore to read its stats; ")
    finally:
        await provisioner.close()


async def test_rotate_returns_new_credential_once(env):
    service, pid, _, _ = env
    created = await service.create(MEMBER, pid, {"name": "cache"})
    await service.get(MEMBER, pid, "cache")
    rotated = await service.rotate_credential(ADMIN, pid, "cache")
    assert rotated["password"] != created["credential"]["password"]
    assert rotated["credential"]["password"] == rotated["password"]
    assert rotated["username"] == "default" and rotated["password"] in rotated["uri"]
    assert "restart" in rotated["note"]
    got = await service.get(MEMBER, pid, "cache")
    assert rotated["password"] not in json.dumps(got)
    # Library-only restart applies it.
    restarted = await service.restart(ADMIN, pid, "cache")
    assert restarted["state"] == "Ready"


async def test_delete(env):
    service, pid, _, _ = env
    await service.create(MEMBER, pid, {"name": "doomed"})
    body = await service.delete(ADMIN, pid, "doomed")
    assert body["name"] == "doomed" and body["state"] == "Deleting"
    assert body["resource_path"].endswith("/memorystores/doomed") and body["note"]
    with pytest.raises(NotFound):
        await service.get(MEMBER, pid, "doomed")
    with pytest.raises(NotFound):
        await service.delete(ADMIN, pid, "doomed")


async def test_list_pages_and_always_has_next_page_token(env):
    service, pid, _, _ = env
    empty = await service.list(MEMBER, pid)
    assert empty == {"memorystores": [], "next_page_token": ""}
    for name in ("c", "a", "b"):
        await service.create(MEMBER, pid, {"name": name})
    first = await service.list(MEMBER, pid, page_size=2)
    assert [m["name"] for m in first["memorystores"]] == ["a", "b"]
    assert first["next_page_token"]
    second = await service.list(MEMBER, pid, page_size=2, page_token=first["next_page_token"])
    assert [m["name"] for m in second["memorystores"]] == ["c"]
    assert second["next_page_token"] == ""
    whole = await service.list(MEMBER, pid)
    assert [m["name"] for m in whole["memorystores"]] == ["a", "b", "c"] and whole["next_page_token"] == ""
    for bad in (0, 201, -1):
        with pytest.raises(BadRequest, match="page_size must be between 1 and 200"):
            await service.list(MEMBER, pid, page_size=bad)
    with pytest.raises(BadRequest, match="page_token is invalid"):
        await service.list(MEMBER, pid, page_token=PlainPages().encode("other-list", "a"))


async def test_health(env):
    service, *_ = env
    status, body = await service.health()
    assert status == 503 and body["status"] == "degraded"  # no database or session key check wired
    assert body["checks"]["kubernetes"]["status"] == "ok"
    assert body["checks"]["database"]["status"] == "unconfigured" and body["checks"]["database"]["detail"]

    async def ok():
        return ProvisionerHealth("ok")

    async def down():
        raise OSError("connection refused")

    healthy = MemoryStoreService(service.provisioner, FakeProjects(), PlainPages(),
                                 checks={"database": ok, "session_key": ok})
    status, body = await healthy.health()
    assert status == 200 and body["status"] == "ok"
    assert set(body["checks"]) == {"kubernetes", "memorystore_crd", "database", "session_key"}
    broken = MemoryStoreService(service.provisioner, FakeProjects(), PlainPages(),
                                checks={"database": down, "session_key": ok})
    status, body = await broken.health()
    assert status == 503 and body["checks"]["database"] == {"status": "unreachable", "detail": "connection refused"}
