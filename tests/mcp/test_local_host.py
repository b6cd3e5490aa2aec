"""The local MCP host: content-addressed images, supervised processes, replace-when-healthy, apps hosts."""

from __future__ import annotations

import os

import httpx
import pytest

from caiplatform.adapters.local.mcp_host import LocalMcpHost
from caiplatform.mcp.source import image_digest
from caiplatform.ports.mcp_host import McpBuild, McpBuildError, McpDeployment, McpServeError
from caiplatform.routing import HostRouter, Upstream, unix_url
from caiplatform.supervisor import ProcessSupervisor
from caiplatform.testing.mcp import http_to, mcp_client, text_of

ADD = '''
from caiplatform.mcp import tool

@tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers.

    Args:
        a: the first addend
        b: the second addend
    """
    return a + b
'''

ENV = '''
import os
from caiplatform.mcp import tool

@tool
def env(name: str) -> str:
    """One variable of the server process, or <unset>."""
    return os.environ.get(name, "<unset>")
'''

TOKEN = "cai_mcp_" + "ab" * 32


async def _answers(upstream: Upstream) -> set[str]:
    """The tools the server behind an apps host's upstream lists (which version it routes to)."""
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}
    async with httpx.AsyncClient(transport=upstream.transport) as http:
        answer = await http.post(upstream.base_url + "/mcp", json=ping, headers=headers)
    assert answer.status_code == 200, answer.text
    return {tool["name"] for tool in answer.json()["result"]["tools"]}


def tools(**handlers: str) -> list[dict]:
    return [{"name": n, "description": "", "handler": h, "schema": {}, "credential_keys": []} for n, h in handlers.items()]


def build_of(version: int, tool_set: list[dict], server: str = "calc") -> McpBuild:
    return McpBuild("p-1", "abc123", "cai-p-abc123", server, version, tool_set, [])


def deployment(image, version: int, *, expose: str = "", server: str = "calc") -> McpDeployment:
    return McpDeployment(
        "p-1", "abc123", "cai-p-abc123", server, version, image, expose,
        env={"CAI_API_URL": "http://127.0.0.1:1", "CAI_PROJECT_ID": "p-1", "CAI_MCP_CREDENTIAL_KEYS": "[]"},
        secret_env={"CAI_MCP_AUTH_TOKEN": TOKEN, "CAI_PROJECT_KEY": "cai_wl_x_y"},
    )


@pytest.fixture
async def host(tmp_path):
    supervisor = ProcessSupervisor(tmp_path / "run")
    host = LocalMcpHost(tmp_path, supervisor=supervisor, hosts=HostRouter("apps.localhost"))
    yield host
    await host.close()
    await supervisor.stop_all()


async def test_build_writes_a_content_addressed_image_and_reuses_it(host, tmp_path):
    first = await host.build(build_of(1, tools(add=ADD)))
    assert first.digest == image_digest(tools(add=ADD), project="p-1")
    assert first.image == f"registry.local/cai-abc123-mcp-calc@{first.digest}"
    tree = tmp_path / "mcp-images" / first.digest.removeprefix("sha256:")
    assert (tree / "tools" / "add.py").read_text() == ADD and (tree / "mcp.json").exists()
    assert host.builds == 1
    again = await host.build(build_of(2, tools(add=ADD), server="other"))
    assert again.digest == first.digest and host.builds == 1  # same tool set: same image, nothing built
    changed = await host.build(build_of(3, tools(add=ADD, env=ENV)))
    assert changed.digest != first.digest and host.builds == 2
    assert not [p for p in (tmp_path / "mcp-images").iterdir() if p.name.startswith(".build-")]


async def test_broken_sources_fail_the_build_with_a_message(host, tmp_path):
    with pytest.raises(McpBuildError, match="does not compile"):
        await host.build(build_of(1, tools(add="def add(:\n")))
    with pytest.raises(McpBuildError, match="the tools do not load: ModuleNotFoundError") as missing:
        await host.build(build_of(1, tools(add="import no_such_module_here\nfrom caiplatform.mcp import tool\n@tool\ndef add(): pass\n")))
    assert "`from caiplatform.mcp import tool, secret`" in str(missing.value)  # what a handler imports
    assert host.builds == 0 and not list((tmp_path / "mcp-images").iterdir())


async def test_serve_replace_rollback_and_remove(host, monkeypatch):
    """One server's life (process starts are the expensive part, so one test walks through it)."""
    import shutil

    monkeypatch.setenv("CAI_SESSION_KEY", "platform-secret-that-tools-must-not-see")
    v1 = await host.build(build_of(1, tools(add=ADD, env=ENV)))
    url1 = await host.serve(deployment(v1, 1, expose="apps"))
    # Reached by a Unix socket bound into its sandbox (a network of its own: no port to connect to).
    assert url1 == unix_url(str(host.serving("p-1", "calc").socket), "/mcp")
    http, over = http_to(url1)
    async with http:
        assert (await http.get(over.removesuffix("/mcp") + "/healthz")).json() == {"status": "ok"}
        assert (await http.post(over, json={})).status_code == 401
        wrong = await http.post(over, json={}, headers={"Authorization": "Bearer cai_mcp_" + "00" * 32})
        assert wrong.status_code == 401
    async with mcp_client(url1, TOKEN) as client:
        listed = {t.name: t for t in (await client.list_tools()).tools}
        assert set(listed) == {"add", "env"}
        schema = listed["add"].input_schema
        assert schema["required"] == ["a"] and schema["properties"]["b"]["default"] == 2
        assert schema["properties"]["a"]["description"] == "the first addend"
        assert listed["add"].description == "Add two numbers."
        assert text_of(await client.call_tool("add", {"a": 40})) == "42"
        assert text_of(await client.call_tool("env", {"name": "CAI_PROJECT_ID"})) == "p-1"
        assert text_of(await client.call_tool("env", {"name": "CAI_MCP_AUTH_TOKEN"})) == TOKEN
        # Only the deployment's variables: the platform's own environment is not inherited.
        assert text_of(await client.call_tool("env", {"name": "CAI_SESSION_KEY"})) == "<unset>"
    assert os.environ["CAI_SESSION_KEY"]

    # expose: apps registers the host name with the platform's router.
    factory = host.hosts.lookup("calc-abc123.apps.localhost")
    assert factory is not None and await _answers(await factory()) == {"add", "env"}

    # A new version replaces the old process once it is healthy.
    old = host.serving("p-1", "calc").process
    v2 = await host.build(build_of(2, tools(add=ADD)))
    url2 = await host.serve(deployment(v2, 2, expose="apps"))
    assert url2 != url1 and host.supervisor.get(old) is None
    async with mcp_client(url2, TOKEN) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"add"}
    with pytest.raises(httpx.HTTPError):
        http, over = http_to(url1)
        async with http:
            await http.get(over.removesuffix("/mcp") + "/healthz")
    assert await _answers(await host.hosts.lookup("calc-abc123.apps.localhost")()) == {"add"}

    # Rolling back re-serves the recorded image: no build.
    builds = host.builds
    url3 = await host.serve(deployment(v1, 1))
    assert host.builds == builds
    async with mcp_client(url3, TOKEN) as client:
        assert {t.name for t in (await client.list_tools()).tools} == {"add", "env"}

    # An image that is gone is refused, and what serves keeps serving.
    shutil.rmtree(host.image_dir(v2.digest))
    with pytest.raises(McpServeError, match="publish again"):
        await host.serve(deployment(v2, 2))
    http, over = http_to(url3)
    async with http:
        assert (await http.get(over.removesuffix("/mcp") + "/healthz")).status_code == 200

    process = host.serving("p-1", "calc").process
    await host.remove("p-1", "calc")
    assert host.serving("p-1", "calc") is None and host.supervisor.get(process) is None
    assert host.hosts.lookup("calc-abc123.apps.localhost") is None
    await host.remove("p-1", "calc")  # idempotent


async def test_a_guarded_helper_import_loads_in_the_build(host):
    """The issue's handler builds: its first import succeeds where the tool is loaded."""
    guarded = ("try:\n    from caiplatform.mcp import tool\nexcept ImportError:\n    from cai_mcp import tool\n\n"
               "@tool\ndef add(a: int) -> int:\n    return a\n")
    image = await host.build(build_of(1, tools(add=guarded)))
    assert image.digest == image_digest(tools(add=guarded), project="p-1") and host.builds == 1
    with pytest.raises(McpBuildError, match="the tools do not load: ModuleNotFoundError"):
        await host.build(build_of(2, tools(add=guarded.replace("caiplatform.mcp", "cai_mcp_absent"))))
