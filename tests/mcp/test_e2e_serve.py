"""End to end on `caiplatform serve`: publish tools with HTTP, call them with the official MCP client."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.mcp import mcp_client, text_of
from caiplatform.testing.serve import ServeProcess

pytestmark = pytest.mark.e2e


GREET = '''
from caiplatform.mcp import secret, tool

@tool(credential_keys=["GREETING"])
def greet(name: str, punctuation: str = "!") -> str:
    """Greet someone with the project's greeting.

    Args:
        name: who to greet
        punctuation: how to end the greeting
    """
    return f"{secret('GREETING')}, {name}{punctuation}"
'''

GREET_V2 = GREET.replace('return f"{secret', 'return "v2 " + f"{secret')

LEAK = '''
from caiplatform.mcp import secret, tool

@tool
def leak() -> str:
    """Try to read a secret this tool never declared."""
    return secret("OTHER")
'''


async def _wait_ready(http: httpx.AsyncClient, url: str, version: int) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        server = (await http.get(url)).json()["mcp_server"]
        if server["status"] == "failed":
            pytest.fail(f"build failed: {server.get('message')}")
        if server["status"] == "ready" and server.get("version") == version:
            return server
        await asyncio.sleep(0.2)
    pytest.fail(f"the server did not become ready with version {version}: {server}")


def _images(data_dir: Path) -> set[str]:
    return {p.name for p in (data_dir / "mcp-images").iterdir() if not p.name.startswith(".")}


async def test_publish_call_rollback_yank_and_restart(tmp_path, openbao):
    data_dir = tmp_path / "data"
    extra = {"CAI_BAO_ADDR": openbao.addr, "CAI_BAO_TOKEN": openbao.root_token}
    server_process = ServeProcess(data_dir, "--api", "core", "--log-level", "warning", env=extra,
                                  unset=("CAI_DATABASE_URL", "DATABASE_URL", "CAI_BASE_URL"))
    base = server_process.base_url
    server_process.start()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            login = await http.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
            http.headers["Authorization"] = f"Bearer {login.json()['token']}"
            with sqlite3.connect(data_dir / "platform.db") as db:
                project_id, short = db.execute("SELECT id, short FROM projects WHERE slug = 'default'").fetchone()
            project = f"/v1/projects/{project_id}"
            for name, value in (("GREETING", "Hello"), ("OTHER", "never-shown")):
                r = await http.post(f"{project}/secrets", json={"name": name, "value": value})
                assert r.status_code == 201, r.text
            servers = f"{project}/mcpservers"
            r = await http.post(servers, json={"name": "greeter", "expose": "apps"})
            assert r.status_code == 201 and r.json()["status"] == "pending", r.text
            r = await http.put(f"{servers}/greeter/tools/greet", json={"handler": GREET, "credentialKeys": ["GREETING"]})
            assert r.status_code == 202, r.text
            await _wait_ready(http, f"{servers}/greeter", 1)
            r = await http.put(f"{servers}/greeter/tools/leak", json={"handler": LEAK, "description": "reads OTHER"})
            assert r.status_code == 202, r.text
            server = await _wait_ready(http, f"{servers}/greeter", 2)
            assert server["tool_names"] == ["greet", "leak"] and server["url"].endswith("/mcp")
            token = (await http.get(f"{servers}/greeter/token")).json()["token"]
            assert token.startswith("cai_mcp_") and len(token) == len("cai_mcp_") + 64

            async with mcp_client(server["url"], token) as client:
                tools = {t.name: t for t in (await client.list_tools()).tools}
                assert tools["leak"].description == "reads OTHER"
                schema = tools["greet"].input_schema
                assert schema["required"] == ["name"] and schema["properties"]["name"]["description"] == "who to greet"
                assert text_of(await client.call_tool("greet", {"name": "Ada"})) == "Hello, Ada!"
                leaked = await client.call_tool("leak", {})
                assert leaked.is_error and "not declared" in text_of(leaked) and "never-shown" not in text_of(leaked)

            async with httpx.AsyncClient() as anonymous:
                assert (await anonymous.post(server["url"], json={})).status_code == 401
                wrong = await anonymous.post(server["url"], json={}, headers={"Authorization": "Bearer cai_mcp_" + "0" * 64})
                assert wrong.status_code == 401
                healthz = await anonymous.get(server["url"].removesuffix("/mcp") + "/healthz")
                assert healthz.status_code == 200

            # expose: apps — the same server through the platform's own port, by host name.
            apps_host = f"greeter-{short}.apps.localhost"
            async with mcp_client(f"{base}/mcp", token, headers={"Host": apps_host}) as client:
                assert text_of(await client.call_tool("greet", {"name": "Bo", "punctuation": "?"})) == "Hello, Bo?"
            async with httpx.AsyncClient() as anonymous:
                refused = await anonymous.post(f"{base}/mcp", json={}, headers={"Host": apps_host})
                assert refused.status_code == 401

            # A change, then a rollback to the recorded image: the old tool set answers, nothing rebuilt.
            r = await http.put(f"{servers}/greeter/tools/greet", json={"handler": GREET_V2, "credential_keys": ["GREETING"]})
            assert r.status_code == 202
            server = await _wait_ready(http, f"{servers}/greeter", 3)
            async with mcp_client(server["url"], token) as client:
                assert text_of(await client.call_tool("greet", {"name": "Ada"})) == "v2 Hello, Ada!"
            images = _images(data_dir)
            r = await http.post(f"{servers}/greeter/versions/2:rollback")
            assert r.status_code == 200 and r.json()["rolled_back"] is True and r.json()["version"] == 2, r.text
            assert _images(data_dir) == images
            server = (await http.get(f"{servers}/greeter")).json()["mcp_server"]
            assert server["version"] == 2 and server["status"] == "ready"
            async with mcp_client(server["url"], token) as client:
                assert text_of(await client.call_tool("greet", {"name": "Ada"})) == "Hello, Ada!"
            versions = (await http.get(f"{servers}/greeter/versions")).json()["versions"]
            assert [(v["version"], v["current"]) for v in versions] == [(3, False), (2, True), (1, False)]

            # Yank rules.
            assert (await http.post(f"{servers}/greeter/versions/2:yank")).status_code == 409
            assert (await http.post(f"{servers}/greeter/versions/3:yank")).json()["yanked"] is True
            assert (await http.post(f"{servers}/greeter/versions/3:rollback")).status_code == 409
            assert (await http.post(f"{servers}/greeter/versions/3:unyank")).json()["yanked"] is False
    finally:
        server_process.stop()

    server_process.start()
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            login = await http.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
            http.headers["Authorization"] = f"Bearer {login.json()['token']}"
            server = await _wait_ready(http, f"{servers}/greeter", 2)
            assert _images(data_dir) == images
            async with mcp_client(server["url"], token) as client:
                assert text_of(await client.call_tool("greet", {"name": "again"})) == "Hello, again!"
    finally:
        server_process.stop()
    assert "never-shown" not in server_process.log_path.read_text()
