"""Issue 34: a hosted MCP server has a network of its own, like an instance. One real `caiplatform serve`.

A tool of project A's MCP server, called through the platform's stable route (`/mcp/<short>/<name>/mcp`)
with the official MCP client, tries every TCP port listening on this machine's loopback (PostgreSQL, NATS,
Valkey, OpenBao and the platform's own among them) and A's memory store: it reaches only the platform API,
the model endpoint and A's store, and it still reads the platform API and the model. Nothing of the server
listens on a port: the platform reaches it by a Unix socket. On the code before this change the MCP server
kept the host's network: the scan reached every engine, and the server listened on a loopback port.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest

from caiplatform.testing.mcp import mcp_client, text_of

from ..serverless.test_serve_e2e import poll
from .test_memorystore_reach import _address, _create_store
from .test_workload_network import ENGINE_PORTS, World, listening_loopback_ports

pytestmark = pytest.mark.e2e

SCAN = r'''
import json, os, socket, urllib.request
from caiplatform.mcp import tool


def _connects(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def _status(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status
    except Exception as exc:
        return getattr(exc, "code", None) or type(exc).__name__


@tool
def scan(targets: list[list]) -> str:
    """Which of the host:port targets accept a connection, and whether the platform and the model answer."""
    reached = [[h, p] for h, p in targets if _connects(h, int(p))]
    api, model = os.environ.get("CAI_API_URL", ""), os.environ.get("MODEL_BASE_URL", "")
    return json.dumps({"reached": reached, "api": api, "model": model,
                       "api_status": _status(api.rstrip("/") + "/healthz") if api else None,
                       "model_status": _status(model.rstrip("/") + "/models") if model else None})
'''


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(tmp_path_factory.mktemp("mcpnet"))
    try:
        yield w
    finally:
        w.close()


def _publish(world: World, project_id: str) -> tuple[str, str]:
    servers = f"/v1/projects/{project_id}/mcpservers"
    created = world.http.post(servers, json={"name": "scanner"})
    assert created.status_code in (200, 201), created.text
    put = world.http.put(f"{servers}/scanner/tools/scan", json={"handler": SCAN})
    assert put.status_code in (200, 201, 202), put.text
    server = poll(lambda: world.http.get(f"{servers}/scanner").json()["mcp_server"],
                  lambda v: v["status"] in ("ready", "failed"), "the MCP server did not settle", timeout=180)
    assert server["status"] == "ready", server
    token = world.http.get(f"{servers}/scanner/token").json()["token"]
    return server["url"], token


@pytest.fixture(scope="module")
def published(world):
    """A's memory store, then A's MCP server (url, token, the store's address)."""
    project_id = world.project("default")["id"]
    store = _address(_create_store(world, project_id, "cache"))
    return (*_publish(world, project_id), store)


def test_an_mcp_servers_tool_reaches_the_platform_the_model_and_its_stores_and_nothing_else(world, published):
    url, token, store = published
    assert urlsplit(url).path.startswith("/mcp/") and urlsplit(url).port == world.server.port, url
    targets = sorted({("127.0.0.1", p) for p in listening_loopback_ports() | set(ENGINE_PORTS)} | {store})

    async def call() -> dict:
        async with mcp_client(url, token) as client:
            return json.loads(text_of(await client.call_tool("scan", {"targets": [list(t) for t in targets]})))

    found = asyncio.run(call())
    given = [urlsplit(found["api"]), *([urlsplit(found["model"])] if found["model"] else [])]
    allowed = {("127.0.0.1", u.port) for u in given if u.hostname in ("127.0.0.1", "localhost")} | {store}
    reached = {(h, p) for h, p in found["reached"]}
    assert ("127.0.0.1", world.server.port) in reached and store in reached, found
    assert reached <= allowed, reached - allowed
    for port, engine in ENGINE_PORTS.items():
        assert ("127.0.0.1", port) not in reached, f"{engine} ({port}) is reachable from an MCP server"
    assert found["api_status"] == 200, found
    assert found["model"] and found["model_status"] == 200, found


def test_no_mcp_server_listens_on_a_port(world, published):
    """The platform reaches a server by its socket: the server's processes own no listening TCP socket."""
    listening = listening_loopback_ports()
    records = [json.loads(p.read_text()) for p in (world.data_dir / "run").glob("*.json")]
    mcp_ports = {int(port) for r in records if str(r.get("name", "")).startswith("mcp-") for port in r.get("ports") or []}
    assert not mcp_ports & listening, mcp_ports & listening
