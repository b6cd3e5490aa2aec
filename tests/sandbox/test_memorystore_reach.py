"""Issue 34: a workload reaches its own project's memory stores, and no other project's. One real `caiplatform serve`.

A Python function of project A starts first; then A and B each create a memory store. The same running
instance (its boot token says so) speaks Valkey's protocol to both addresses the memory-store API reports
(`credential.uri`): A's answers `PONG`, B's is not there, nor is any other loopback port of the machine that
is not the platform API, the model or A's store. Once A's store is deleted its address is gone from the
workload's network too. On the code before this change A's own store was unreachable as well (nothing of a
store's address existed in a workload's network namespace).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from ..serverless.test_serve_e2e import poll
from .test_workload_network import World, listening_loopback_ports

pytestmark = pytest.mark.e2e

STOREPROBE = r'''
import os, socket
from urllib.parse import urlsplit

BOOT = os.urandom(8).hex()  # one value per process: the test sees whether the same instance answered


def command(*words):
    out = b"*%d\r\n" % len(words)
    for word in words:
        data = word.encode()
        out += b"$%d\r\n%s\r\n" % (len(data), data)
    return out


def ping(uri):
    parts = urlsplit(uri)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=5) as s:
            s.settimeout(5)
            s.sendall(command("AUTH", parts.username or "default", parts.password or "") + command("PING"))
            data = b""
            while b"PONG" not in data and b"-" not in data and len(data) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
            return data.decode("latin-1")
    except OSError as exc:
        return "error: %s" % type(exc).__name__


def connects(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def handle(event, context):
    pings = {name: ping(uri) for name, uri in event.get("stores", {}).items()}
    reached = [[h, p] for h, p in event.get("ports", []) if connects(h, p)]
    given = {name: os.environ.get(name, "") for name in ("CAI_API_URL", "MODEL_BASE_URL")}
    return {"boot": BOOT, "pings": pings, "reached": reached, "given": given}
'''


def _create_store(world: World, project_id: str, name: str) -> str:
    created = world.http.post(f"/v1/projects/{project_id}/memorystores", json={"name": name})
    assert created.status_code in (200, 201, 202), created.text
    uri = created.json()["credential"]["uri"]
    poll(lambda: world.http.get(f"/v1/projects/{project_id}/memorystores/{name}").json(),
         lambda v: v.get("ready") is True, f"memory store {name} did not become ready", timeout=120)
    return str(uri)


def _address(uri: str) -> tuple[str, int]:
    parts = urlsplit(uri)
    assert parts.hostname and parts.port, uri
    return parts.hostname, parts.port


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("stores"))
    try:
        w.project("team-b")
        w.deploy("default", "storeprobe", {"main.py": STOREPROBE}, framework="function")
        w.ready("default", "storeprobe")
        yield w
    finally:
        w.close()


def test_a_running_workload_reaches_its_projects_store_created_after_it_started_and_no_other(world):
    first = world.invoke("default", "storeprobe", {})
    assert first.status_code == 200, first.text
    boot = first.json()["boot"]

    a = world.project("default")["id"]
    b = world.project("team-b")["id"]
    own = _create_store(world, a, "cache")
    other = _create_store(world, b, "cache")
    assert _address(own) != _address(other)

    given = [urlsplit(url) for url in first.json()["given"].values() if url]
    allowed = {("127.0.0.1", u.port) for u in given if u.hostname in ("127.0.0.1", "localhost") and u.port}
    assert world.server.port in {port for _, port in allowed}, given
    allowed.add(_address(own))
    candidates = {("127.0.0.1", port) for port in listening_loopback_ports()} | {_address(own), _address(other)}
    answer = world.invoke("default", "storeprobe", {"stores": {"own": own, "other": other},
                                                    "ports": sorted(candidates)})
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert found["boot"] == boot, "the instance was replaced: this would not show a store reached live"
    assert "+PONG" in found["pings"]["own"], found["pings"]
    assert found["pings"]["other"].startswith("error"), found["pings"]
    reached = {(host, port) for host, port in found["reached"]}
    assert _address(own) in reached
    assert reached <= allowed, reached - allowed


def test_a_deleted_store_is_gone_from_the_workloads_network(world):
    a = world.project("default")["id"]
    uri = _create_store(world, a, "short-lived")
    before = world.invoke("default", "storeprobe", {"stores": {"it": uri}})
    assert before.status_code == 200 and "+PONG" in before.json()["pings"]["it"], before.text
    deleted = world.http.delete(f"/v1/projects/{a}/memorystores/short-lived")
    assert deleted.status_code in (200, 202, 204), deleted.text
    host, port = _address(uri)

    def reach() -> dict:
        answer = world.invoke("default", "storeprobe", {"ports": [[host, port]]})
        assert answer.status_code == 200, answer.text
        return answer.json()

    poll(reach, lambda v: v["reached"] == [], "a deleted store's address stayed open in the workload", timeout=60)
