"""The memory store API over HTTP (in-process ASGI), on the in-memory platform."""

from __future__ import annotations

import base64
import json
import time
import uuid

import anyio
import pytest
import redis

from caiplatform.testing.http import asgi_client, login

from .conftest import PASSWORD

POLICIES = ("noeviction, allkeys-lru, allkeys-lfu, allkeys-random, volatile-lru, volatile-lfu, "
            "volatile-random, volatile-ttl")


@pytest.fixture
async def http(platform, users):
    async with asgi_client(platform, ["memorystore", "core"]) as c:
        # One real sign-in proves the path; the others get their session token minted directly (argon2 is slow).
        member = await login(c, users.member.email, PASSWORD)
        admin, stranger = (bearer(platform, p) for p in (users.admin, users.stranger))
        yield c, users.project_id, member, admin, stranger


def bearer(platform, principal) -> dict[str, str]:
    token, _ = platform.auth.tokens.issue(principal.user_id, platform.clock.time())
    return {"Authorization": f"Bearer {token}"}


def base(pid: str) -> str:
    return f"/v1/projects/{pid}/memorystores"


async def test_create_get_use_with_redis_and_list(http):
    c, pid, member, _, _ = http
    r = await c.post(base(pid), headers=member, json={"name": "cache"})
    assert r.status_code == 201, r.text
    body = r.json()
    assert set(body) == {"memorystore", "credential", "note"}
    assert body["memorystore"] == {"name": "cache", "state": "Provisioning", "ready": False}
    cred = body["credential"]
    assert set(cred) == {"username", "password", "uri"}
    assert cred["username"] == "default" and len(base64.urlsafe_b64decode(cred["password"] + "==")) == 24

    got = await c.get(f"{base(pid)}/cache", headers=member)
    assert got.status_code == 200
    obj = got.json()
    assert obj["ready"] is True and obj["state"] == "Ready"
    assert cred["password"] not in got.text and "password" not in obj
    assert obj["connection"]["credential_secret"] == "ms-cache-credential"

    # A real client connects with the handed-out URI.
    client = redis.Redis.from_url(cred["uri"], protocol=2, retry=None)
    try:
        assert client.set("k", "v") and client.get("k") == b"v"
    finally:
        client.close()

    listed = await c.get(base(pid), headers=member)
    assert listed.status_code == 200
    assert set(listed.json()) == {"memorystores", "next_page_token"}
    assert listed.json()["next_page_token"] == ""
    assert [m["name"] for m in listed.json()["memorystores"]] == ["cache"]
    assert cred["password"] not in listed.text


async def test_paging_over_http(http):
    c, pid, member, _, _ = http
    for name in ("b", "a", "c"):
        assert (await c.post(base(pid), headers=member, json={"name": name})).status_code == 201
    first = (await c.get(base(pid), headers=member, params={"page_size": 2})).json()
    assert [m["name"] for m in first["memorystores"]] == ["a", "b"] and first["next_page_token"]
    second = (await c.get(base(pid), headers=member, params={"page_size": 2, "page_token": first["next_page_token"]})).json()
    assert [m["name"] for m in second["memorystores"]] == ["c"] and second["next_page_token"] == ""
    for bad in ("0", "201", "x"):
        r = await c.get(base(pid), headers=member, params={"page_size": bad})
        assert r.status_code == 400 and r.json()["error"] == "page_size must be between 1 and 200"
    r = await c.get(base(pid), headers=member, params={"page_token": "forged"})
    assert r.status_code == 400
    assert r.json()["error"] == "page_token is invalid or was issued for a different list; start from the first page"


@pytest.mark.parametrize(
    ("payload", "status", "error"),
    [
        ({"name": "x", "size_class": "xl"}, 400, "sizeClass must be one of small, medium, large"),
        ({"name": "x", "maxmemory_policy": "lru"}, 400, f"maxmemoryPolicy must be one of {POLICIES}"),
        ({"name": "Bad"}, 400, None),
        ({"name": "a" * 41}, 400, None),
        ({}, 400, "name is required"),
    ],
)
async def test_create_validation_over_http(http, payload, status, error):
    c, pid, member, _, _ = http
    r = await c.post(base(pid), headers=member, json=payload)
    assert r.status_code == status
    assert set(r.json()) == {"error", "request_id"}
    if error:
        assert r.json()["error"] == error


async def test_body_errors(http):
    c, pid, member, _, _ = http
    r = await c.post(base(pid), headers={**member, "content-type": "application/json"}, content=b"{nope")
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON body: ")
    big = json.dumps({"name": "big", "x": "y" * (16 * 1024)}).encode()
    r = await c.post(base(pid), headers={**member, "content-type": "application/json"}, content=big)
    assert r.status_code == 413
    ok = json.dumps({"name": "fits", "x": "y" * (15 * 1024)}).encode()
    assert (await c.post(base(pid), headers={**member, "content-type": "application/json"}, content=ok)).status_code == 201
    r = await c.post(base(pid), headers=member, json={"name": "fits"})
    assert r.status_code == 409


async def test_auth_404_and_403_rules(http):
    c, pid, member, admin, stranger = http
    assert (await c.post(base(pid), headers=member, json={"name": "cache"})).status_code == 201
    r = await c.get(base(pid))
    assert r.status_code == 401 and "Bearer" in r.json()["error"] and "sign in" in r.json()["error"]
    assert (await c.get(base(pid), headers={"Authorization": "Bearer nonsense"})).status_code == 401
    # Not a member, or another project, or a missing instance: identical 404s.
    answers = [
        await c.get(f"{base(pid)}/cache", headers=stranger),
        await c.get(f"{base(str(uuid.uuid4()))}/cache", headers=member),
        await c.get(f"{base(pid)}/missing", headers=member),
    ]
    assert {a.status_code for a in answers} == {404}
    assert len({a.json()["error"] for a in answers}) >= 1
    assert (await c.get(base(pid), headers=stranger)).status_code == 404
    # A malformed project id is 400 on this API.
    assert (await c.get(base("not-a-uuid"), headers=member)).status_code == 400
    # Members may not delete or rotate.
    assert (await c.delete(f"{base(pid)}/cache", headers=member)).status_code == 403
    assert (await c.post(f"{base(pid)}/cache/rotate-credential", headers=member)).status_code == 403
    assert (await c.delete(f"{base(pid)}/cache", headers=stranger)).status_code == 404


async def test_stats_over_http(http):
    c, pid, member, _, _ = http
    created = (await c.post(base(pid), headers=member, json={"name": "cache", "size_class": "medium"})).json()
    await c.get(f"{base(pid)}/cache", headers=member)
    client = redis.Redis.from_url(created["credential"]["uri"], protocol=2, retry=None)
    client.mset({"a": 1, "b": 2})
    client.close()
    r = await c.get(f"{base(pid)}/cache/stats", headers=member)
    assert r.status_code == 200
    stats = r.json()
    assert stats["name"] == "cache" and stats["db_keys"] == 2
    assert stats["maxmemory_bytes"] == 768 * 1024 * 1024 and stats["maxmemory_policy"] == "noeviction"
    assert "hit_rate" not in stats and "used_memory_bytes" not in stats  # the double reports neither


async def test_not_provisioned_yet_is_409(http, platform):
    c, pid, member, admin, _ = http
    platform.memorystores.provisioner._delay = 60
    assert (await c.post(base(pid), headers=member, json={"name": "slow"})).status_code == 201
    r = await c.get(f"{base(pid)}/slow/stats", headers=member)
    assert r.status_code == 409 and "not provisioned yet" in r.json()["error"]
    r = await c.post(f"{base(pid)}/slow/rotate-credential", headers=admin)
    assert r.status_code == 409


async def test_rotate_and_delete_over_http(http):
    c, pid, member, admin, _ = http
    created = (await c.post(base(pid), headers=member, json={"name": "cache"})).json()
    await c.get(f"{base(pid)}/cache", headers=member)
    r = await c.post(f"{base(pid)}/cache/rotate-credential", headers=admin)
    assert r.status_code == 200
    rotated = r.json()
    assert rotated["password"] != created["credential"]["password"]
    assert rotated["credential"] == {k: rotated[k] for k in ("username", "password", "uri")}
    assert "restart" in rotated["note"]
    r = await c.delete(f"{base(pid)}/cache", headers=admin)
    assert r.status_code == 202
    assert r.json()["state"] == "Deleting" and r.json()["name"] == "cache"
    assert r.json()["resource_path"].endswith("/memorystores/cache") and r.json()["note"]
    assert (await c.get(f"{base(pid)}/cache", headers=member)).status_code == 404


async def test_health_and_livez(platform):
    async with asgi_client(platform, ["memorystore"]) as c:
        r = await c.get("/healthz")
        assert r.status_code == 200
        body = r.json()
        assert body["status"] == "ok"
        assert set(body["checks"]) == {"kubernetes", "memorystore_crd", "database", "session_key"}
        assert all(v["status"] == "ok" for v in body["checks"].values())
        r = await c.get("/livez")
        assert r.status_code == 200 and r.json() == {"status": "ok"}


async def test_embedded_platform_restart_keeps_instance_and_data(tmp_path, settings, users_of):
    """The durable default: a real Valkey per instance, brought back with its data by the next server."""
    from caiplatform.platform import Platform

    first = Platform.embedded(tmp_path, settings)
    await first.start()
    users = await users_of(first)
    async with asgi_client(first, ["memorystore"]) as c:
        headers = bearer(first, users.member)
        created = await c.post(base(users.project_id), headers=headers, json={"name": "durable", "size_class": "small"})
        assert created.status_code == 201
        uri = created.json()["credential"]["uri"]
        got = await poll_ready(c, f"{base(users.project_id)}/durable", headers)
        # Document 3: port 6379; on one machine each instance has its own loopback address for it.
        assert got["connection"]["port"] == 6379 and got["connection"]["host"] != "127.0.0.1"
        assert f"@{got['connection']['host']}:6379/" in uri and "note" not in got
        client = redis.Redis.from_url(uri, protocol=2, retry=None)
        client.set("kept", "across restarts")
        client.get("kept")
        client.close()
        stats = (await c.get(f"{base(users.project_id)}/durable/stats", headers=headers)).json()
        assert stats["hit_rate"] == 1.0 and 0 < stats["used_memory_pct"] < 100
        assert stats["maxmemory_bytes"] == 192 * 1024 * 1024
    await first.aclose()

    second = Platform.embedded(tmp_path, settings)
    await second.start()
    try:
        async with asgi_client(second, ["memorystore"]) as c:
            headers = bearer(second, users.member)
            await poll_ready(c, f"{base(users.project_id)}/durable", headers)
            client = redis.Redis.from_url(uri, protocol=2, retry=None)
            try:
                assert client.get("kept") == b"across restarts"
            finally:
                client.close()
            admin = bearer(second, users.admin)
            assert (await c.delete(f"{base(users.project_id)}/durable", headers=admin)).status_code == 202
            assert not (tmp_path / "memorystores" / users.project_id / "durable").exists()
    finally:
        await second.aclose()


async def poll_ready(c, url: str, headers: dict[str, str], timeout: float = 20.0) -> dict:
    """Poll the instance until `ready` is true, as a client is told to."""
    deadline = time.monotonic() + timeout
    while True:
        body = (await c.get(url, headers=headers)).json()
        if body.get("ready"):
            assert body["state"] == "Ready"
            return body
        assert body["state"] == "Provisioning" and time.monotonic() < deadline, body
        await anyio.sleep(0.05)
