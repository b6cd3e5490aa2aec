"""Memory stores and hosted MCP servers on two replicas: created through one, read and changed through
either, run by one, taken over by the other when the first is killed (-9, with its processes), the
store's data and the server's workload key kept; the killed replica starts again without minting a key."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import create_engine, text

from caiplatform.testing.cluster import kill_replica
from caiplatform.testing.mcp import mcp_client, text_of

from .conftest import Cluster
from .support import poll

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("replicas_up")]

GREET = '''
from caiplatform.mcp import secret, tool


@tool(credential_keys=["CLUSTER_GREETING"])
def greet(name: str) -> str:
    """Greet someone with the project's greeting."""
    return f"{secret('CLUSTER_GREETING')}, {name}"
'''


def _db(cluster: Cluster, query: str, **params: Any) -> list[Any]:
    engine = create_engine(cluster.database_url)
    try:
        with engine.begin() as conn:
            return list(conn.execute(text(query), params))
    finally:
        engine.dispose()


def _greet(url: str, token: str, name: str, host: str | None = None) -> str:
    async def call() -> str:
        async with mcp_client(url, token, headers={"Host": host} if host else None) as client:
            return text_of(await client.call_tool("greet", {"name": name}))

    return asyncio.run(call())


def _greets(url: str, token: str, host: str | None = None) -> bool:
    try:
        return _greet(url, token, "Bo", host) == "Hi, Bo"
    except Exception:  # noqa: BLE001 - not serving (yet)
        return False


def test_memory_stores_and_mcp_servers_answer_through_any_replica_and_survive_theirs(cluster: Cluster,
                                                                                    work: dict[str, Any]) -> None:
    a, b = cluster.replicas
    auth, pid = cluster.automation, work["pid"]
    stores = f"/v1/projects/{pid}/memorystores"
    servers = f"/v1/projects/{pid}/mcpservers"
    apps_host = f"greeter-{work['short']}.apps.localhost"

    # The store created through B (B runs it), the server through A (A builds and runs it).
    created = httpx.post(f"{b.base_url}{stores}", headers=auth, json={"name": "shared"}, timeout=30)
    assert created.status_code == 201, created.text
    assert httpx.post(f"{a.base_url}{servers}", headers=auth, json={"name": "greeter", "expose": "apps"}).status_code == 201
    secret = cluster.lb.post(f"/v1/projects/{pid}/secrets", headers=auth, json={"name": "CLUSTER_GREETING", "value": "Hi"})
    assert secret.status_code == 201, secret.text
    published = httpx.put(f"{a.base_url}{servers}/greeter/tools/greet", headers=auth, json={"handler": GREET}, timeout=30)
    assert published.status_code == 202, published.text

    def store() -> dict[str, Any]:
        answer = httpx.get(f"{a.base_url}{stores}/shared", headers=auth, timeout=30)
        return dict(answer.json()) if answer.status_code == 200 else {"status": answer.status_code}

    def mcp_server(version: int) -> dict[str, Any]:
        return poll(lambda: httpx.get(f"{b.base_url}{servers}/greeter", headers=auth).json()["mcp_server"],
                    lambda view: view.get("version") == version and view["status"] in ("ready", "failed"),
                    f"version {version} did not roll out")

    poll(store, lambda view: view.get("ready"), "the memory store did not become ready (read through A)")
    writer = redis.Redis.from_url(created.json()["credential"]["uri"], socket_timeout=5)
    assert writer.set("kept", "across a takeover")
    # Persistence: WAITAOF answers once this connection's writes are fsynced to the append-only file
    # (the instance syncs every second), so the kill below cannot lose them.
    assert writer.execute_command("WAITAOF", 1, 0, 4000) == [1, 0]
    stats = httpx.get(f"{a.base_url}{stores}/shared/stats", headers=auth, timeout=30)  # A reads B's instance
    assert stats.status_code == 200, stats.text
    assert _db(cluster, "SELECT owner FROM memorystore_instances WHERE name = 'shared'") == [("replica-b",)]
    first = mcp_server(1)
    assert first["status"] == "ready", first
    token = httpx.get(f"{b.base_url}{servers}/greeter/token", headers=auth).json()["token"]
    assert _greet(first["url"], token, "Ada") == "Hi, Ada"  # its workload key reads the secret
    poll(lambda: _greets(f"{b.base_url}/mcp", token, apps_host), bool, "B does not route the apps host to A", timeout=10)
    [(owner, key_id, loopback_a_v1)] = _db(cluster, "SELECT owner, workload_key_id, url FROM mcp_servers WHERE name = 'greeter'")
    assert owner == "replica-a" and key_id
    assert first["url"] == f"{b.base_url}/mcp/{work['short']}/greeter/mcp"  # B's route to A's process

    # A rollout through B: B serves version 2, A stops version 1; the workload key stays.
    republished = httpx.put(f"{b.base_url}{servers}/greeter/tools/greet", headers=auth,
                            json={"handler": GREET, "description": "version 2"}, timeout=30)
    assert republished.status_code == 202, republished.text
    second = mcp_server(2)
    assert second["status"] == "ready" and _greets(second["url"], token), second
    assert second["url"] == first["url"]  # the platform's route: the same address whoever serves which version
    assert _db(cluster, "SELECT owner, workload_key_id FROM mcp_servers WHERE name = 'greeter'") == [("replica-b", key_id)]
    [(loopback_v2,)] = _db(cluster, "SELECT url FROM mcp_servers WHERE name = 'greeter'")
    poll(lambda: _greets(loopback_a_v1, token), lambda up: not up, "A still serves version 1", timeout=10)
    # Rotated through A: the new password is in force once the instance restarts (wherever it runs).
    rotated = httpx.post(f"{a.base_url}{stores}/shared/rotate-credential", headers=auth, timeout=30)
    assert rotated.status_code == 200, rotated.text
    new_uri = rotated.json()["credential"]["uri"]

    kill_replica(b)
    killed = time.monotonic()
    # Documented bound: A's next round (1 s for stores, 2 s for servers) after PostgreSQL frees B's locks
    # (at once for a killed process), plus the start; the slack is for a loaded machine.
    poll(store, lambda view: view.get("ready"), "A did not take the memory store over", timeout=15)
    assert _db(cluster, "SELECT owner FROM memorystore_instances WHERE name = 'shared'") == [("replica-a",)]
    assert redis.Redis.from_url(new_uri, socket_timeout=2).get("kept") == b"across a takeover"
    print(f"memory store taken over {time.monotonic() - killed:.1f} s after the kill")
    moved = poll(lambda: httpx.get(f"{a.base_url}{servers}/greeter", headers=auth).json()["mcp_server"],
                 lambda view: _db(cluster, "SELECT owner FROM mcp_servers WHERE name = 'greeter'") == [("replica-a",)]
                 and _greets(view["url"], token),
                 "A did not take the mcp server over", timeout=20)
    # A's answer names A's address (each replica's CAI_BASE_URL; one shared load-balancer address where the
    # operator sets it), and the path is the same route as before the takeover.
    assert moved["url"] == second["url"].replace(b.base_url, a.base_url)
    [(loopback_a_v2,)] = _db(cluster, "SELECT url FROM mcp_servers WHERE name = 'greeter'")
    assert loopback_a_v2 != loopback_v2  # the process moved, the route did not
    print(f"mcp server taken over {time.monotonic() - killed:.1f} s after the kill")
    assert moved["status"] == "ready" and moved["version"] == 2, moved
    [(server_id, owner, kept)] = _db(cluster, "SELECT id, owner, workload_key_id FROM mcp_servers WHERE name = 'greeter'")
    assert (owner, kept) == ("replica-a", key_id)
    live = _db(cluster, "SELECT key_id FROM api_keys WHERE kind = 'workload' AND display_name = :label "
                        "AND revoked_at IS NULL", label=f"mcp:{server_id}")
    assert live == [(key_id,)], live  # minted once, through a rollout and a takeover
    assert _greets(f"{a.base_url}/mcp", token, apps_host)
    cluster.restart(b, wait=False)

    assert httpx.delete(f"{a.base_url}{stores}/shared", headers=auth, timeout=30).status_code == 202
    assert store() == {"status": 404}
    assert httpx.delete(f"{a.base_url}{servers}/greeter", headers=auth).status_code == 200
    assert not _greets(moved["url"], token)
