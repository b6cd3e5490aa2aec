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


def _greet(url: str, token: str, name: str) -> str:
    async def call() -> str:
        async with mcp_client(url, token) as client:
            return text_of(await client.call_tool("greet", {"name": name}))

    return asyncio.run(call())


def _greets(url: str, token: str) -> bool:
    try:
        return _greet(url, token, "Bo") == "Hi, Bo"
    except Exception:  # noqa: BLE001 - not serving (yet)
        return False


def test_memory_stores_and_mcp_servers_answer_through_any_replica_and_survive_theirs(cluster: Cluster,
                                                                                    work: dict[str, Any]) -> None:
    a, b = cluster.replicas
    auth, pid = cluster.automation, work["pid"]
    stores = f"/v1/projects/{pid}/memorystores"
    servers = f"/v1/projects/{pid}/mcpservers"

    # Created through A: A runs both.
    created = httpx.post(f"{a.base_url}{stores}", headers=auth, json={"name": "shared"}, timeout=30)
    assert created.status_code == 201, created.text
    assert httpx.post(f"{a.base_url}{servers}", headers=auth, json={"name": "greeter"}).status_code == 201
    secret = cluster.lb.post(f"/v1/projects/{pid}/secrets", headers=auth, json={"name": "CLUSTER_GREETING", "value": "Hi"})
    assert secret.status_code == 201, secret.text
    published = httpx.put(f"{a.base_url}{servers}/greeter/tools/greet", headers=auth, json={"handler": GREET}, timeout=30)
    assert published.status_code == 202, published.text

    def store(via: Any = None) -> dict[str, Any]:
        answer = httpx.get(f"{(via or b).base_url}{stores}/shared", headers=auth, timeout=30)
        return dict(answer.json()) if answer.status_code == 200 else {"status": answer.status_code}

    poll(store, lambda view: view.get("ready"), "the memory store did not become ready (read through B)")
    client = redis.Redis.from_url(created.json()["credential"]["uri"], socket_timeout=2)
    assert client.set("kept", "across a takeover")
    stats = httpx.get(f"{b.base_url}{stores}/shared/stats", headers=auth, timeout=30)  # B reads A's instance
    assert stats.status_code == 200, stats.text
    server = poll(lambda: httpx.get(f"{b.base_url}{servers}/greeter", headers=auth).json()["mcp_server"],
                  lambda view: view["status"] in ("ready", "failed"), "the mcp server did not become ready")
    assert server["status"] == "ready", server
    token = httpx.get(f"{b.base_url}{servers}/greeter/token", headers=auth).json()["token"]
    assert _greet(server["url"], token, "Ada") == "Hi, Ada"  # its workload key reads the secret
    [(owner, key_id)] = _db(cluster, "SELECT owner, workload_key_id FROM mcp_servers WHERE name = 'greeter'")
    assert owner == "replica-a" and key_id
    assert _db(cluster, "SELECT owner FROM memorystore_instances WHERE name = 'shared'") == [("replica-a",)]

    # Rotated through B: the new password is in force once the instance restarts (wherever it runs).
    rotated = httpx.post(f"{b.base_url}{stores}/shared/rotate-credential", headers=auth, timeout=30)
    assert rotated.status_code == 200, rotated.text
    new_uri = rotated.json()["credential"]["uri"]
    time.sleep(1.2)  # persistence: the append-only file is synced every second

    kill_replica(a)
    killed = time.monotonic()
    # Documented bound: B's next round (1 s for stores, 2 s for servers) after PostgreSQL frees A's locks
    # (at once for a killed process), plus the start; the slack is for a loaded machine.
    poll(lambda: store(b), lambda view: view.get("ready"), "B did not take the memory store over", timeout=15)
    assert _db(cluster, "SELECT owner FROM memorystore_instances WHERE name = 'shared'") == [("replica-b",)]
    assert redis.Redis.from_url(new_uri, socket_timeout=2).get("kept") == b"across a takeover"
    print(f"memory store taken over {time.monotonic() - killed:.1f} s after the kill")
    moved = poll(lambda: httpx.get(f"{b.base_url}{servers}/greeter", headers=auth).json()["mcp_server"],
                 lambda view: view["url"] != server["url"] and _greets(view["url"], token),
                 "B did not take the mcp server over", timeout=20)
    print(f"mcp server taken over {time.monotonic() - killed:.1f} s after the kill")
    assert moved["status"] == "ready" and moved["version"] == 1, moved
    assert _db(cluster, "SELECT owner, workload_key_id FROM mcp_servers WHERE name = 'greeter'") == [("replica-b", key_id)]

    # A starts again: it serves neither (B runs both) and mints no key; A deletes what B runs.
    cluster.restart(a)
    [(server_id,)] = _db(cluster, "SELECT id FROM mcp_servers WHERE name = 'greeter'")
    keys = _db(cluster, "SELECT key_id, revoked_at IS NULL FROM api_keys WHERE kind = 'workload' AND display_name = :label",
               label=f"mcp:{server_id}")
    assert keys == [(key_id, True)], keys
    assert _greets(moved["url"], token)
    deleted = httpx.delete(f"{a.base_url}{stores}/shared", headers=auth, timeout=30)
    assert deleted.status_code == 202, deleted.text
    poll(lambda: store(b), lambda view: view.get("status") == 404, "the deleted store is still read", timeout=10)
    assert _db(cluster, "SELECT count(*) FROM memorystore_instances WHERE name = 'shared'") == [(0,)]
    assert httpx.delete(f"{a.base_url}{servers}/greeter", headers=auth).status_code == 200
    poll(lambda: _greets(moved["url"], token), lambda up: not up, "B still serves the deleted server", timeout=10)
