"""Conformance suite of the MCP host port (`caiplatform.ports.mcp_host.McpHost`).

Each test takes an `mcp_host` fixture: a fresh host whose images go to a fresh place. Adapters that
serve nothing real mark the serving tests `notimpl`.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from caiplatform.mcp.source import image_digest
from caiplatform.ports.mcp_host import McpBuild, McpBuildError, McpDeployment, McpHost, McpImage
from caiplatform.testing.mcp import http_to

notimpl = pytest.mark.notimpl

TOKEN = "cai_mcp_" + "5e" * 32

ECHO = '''
from caiplatform.mcp import tool

@tool
def echo(text: str) -> str:
    """Say it back."""
    return text
'''


def tool_set(**handlers: str) -> list[dict]:
    return [{"name": n, "description": "", "handler": h, "schema": {}, "credential_keys": []} for n, h in handlers.items()]


def a_build(version: int = 1, tools: list[dict] | None = None, server: str = "conf") -> McpBuild:
    return McpBuild("project-1", "short1", "cai-p-short1", server, version, tools or tool_set(echo=ECHO), [])


def a_deployment(image: McpImage, version: int = 1, server: str = "conf") -> McpDeployment:
    return McpDeployment(
        "project-1", "short1", "cai-p-short1", server, version, image, "",
        env={"CAI_API_URL": "http://127.0.0.1:1", "CAI_PROJECT_ID": "project-1", "CAI_MCP_CREDENTIAL_KEYS": "[]"},
        secret_env={"CAI_MCP_AUTH_TOKEN": TOKEN, "CAI_PROJECT_KEY": "cai_wl_conformance_key"},
    )


async def test_the_same_tool_set_builds_to_the_same_digest(mcp_host: McpHost):
    first = await mcp_host.build(a_build(1))
    again = await mcp_host.build(a_build(2))
    assert first == again and first.digest.startswith("sha256:")
    other = await mcp_host.build(a_build(3, tool_set(echo=ECHO, other=ECHO.replace("def echo", "def other"))))
    assert other.digest != first.digest
    elsewhere = await mcp_host.build(replace(a_build(1), project_id="project-2", project_short="short2",
                                             namespace="cai-p-short2"))
    assert elsewhere.digest != first.digest  # another project's same tool set is another image


@notimpl(["kubernetes", "kubernetes-cluster"],
         reason="a cluster's image is named by the digest its registry gave the pushed image, not by the tool set's hash")
async def test_the_digest_is_the_tool_sets_content_hash(mcp_host: McpHost):
    assert (await mcp_host.build(a_build(1))).digest == image_digest(tool_set(echo=ECHO), project="project-1")


async def test_the_image_names_registry_project_and_server(mcp_host: McpHost):
    image = await mcp_host.build(a_build())
    assert image.image.endswith(f"/cai-short1-mcp-conf@{image.digest}") and image.digest.startswith("sha256:")


async def test_a_broken_tool_fails_the_build_with_its_reason(mcp_host: McpHost):
    with pytest.raises(McpBuildError, match="does not compile"):
        await mcp_host.build(a_build(1, tool_set(echo="def echo(:\n")))
    with pytest.raises(McpBuildError, match="no function decorated with @tool"):
        await mcp_host.build(a_build(1, tool_set(echo="x = 1\n")))


async def test_serve_returns_an_mcp_url_and_remove_is_idempotent(mcp_host: McpHost):
    image = await mcp_host.build(a_build())
    url = await mcp_host.serve(a_deployment(image))
    assert url.startswith("http") and url.endswith("/mcp")
    await mcp_host.remove("project-1", "conf")
    await mcp_host.remove("project-1", "conf")
    await mcp_host.remove("project-1", "never-served")


@notimpl(["memory"], reason="the in-memory host records deployments; nothing listens")
@notimpl(["kubernetes"], reason="the API emulator's data plane answers with the runtime suite's tiny app, not the image's MCP server")
async def test_the_endpoint_answers_health_openly_and_mcp_only_with_the_token(mcp_host: McpHost):
    image = await mcp_host.build(a_build())
    http, url = http_to(await mcp_host.serve(a_deployment(image)), timeout=10)
    try:
        async with http:
            assert (await http.get(url.removesuffix("/mcp") + "/healthz")).status_code == 200
            assert (await http.post(url, json={})).status_code == 401
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {}}
            answered = await http.post(
                url, json=ping,
                headers={"Authorization": f"Bearer {TOKEN}", "Accept": "application/json, text/event-stream",
                         "MCP-Protocol-Version": "2025-06-18"},
            )
            assert answered.status_code == 200, answered.text
    finally:
        await mcp_host.remove("project-1", "conf")
