"""A durable platform serves MCP servers from the local host and serves them again after a restart."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from caiplatform.db.models import ApiKey, Project
from caiplatform.models.mcp import McpServerCreate, McpToolPublish
from caiplatform.platform import Platform
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.mcp import http_to, mcp_client, text_of

ADD = '''
from caiplatform.mcp import tool

@tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b
'''

async def _admin(platform: Platform):
    signed_in = await platform.auth.login(ADMIN_EMAIL, ADMIN_PASSWORD, client_ip=None)
    principal = await platform.auth.authenticate(signed_in.token)
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    return principal, project_id


async def test_ready_servers_are_served_again_after_a_restart(tmp_path, settings, openbao):
    settings = settings.model_copy(update={"bao_addr": openbao.addr, "bao_token": openbao.root_token})
    data_dir = tmp_path / "data"
    async with Platform.embedded(data_dir, settings) as platform:
        principal, project_id = await _admin(platform)
        await platform.mcp.create(principal, project_id, McpServerCreate(name="calc"))
        await platform.mcp.publish_tool(principal, project_id, "calc", "add", McpToolPublish(handler=ADD))
        await platform.mcp.wait_idle()
        server = await platform.mcp.get(principal, project_id, "calc")
        assert server.status == "ready", server
        token = await platform.mcp.token(principal, project_id, "calc")
        async with mcp_client(server.url, token) as client:
            assert text_of(await client.call_tool("add", {"a": 1})) == "3"
        first_url = server.url
    # The platform stopped its server processes.
    http, first_url = http_to(first_url)
    async with http:
        try:
            await http.get(first_url.removesuffix("/mcp") + "/healthz", timeout=2)
            raise AssertionError("the MCP server outlived its platform")
        except httpx.HTTPError:
            pass

    async with Platform.embedded(data_dir, settings) as platform:
        principal, project_id = await _admin(platform)
        server = await platform.mcp.get(principal, project_id, "calc")
        assert server.status == "ready" and server.version == 1 and server.url != first_url, server
        assert platform.mcp.host.builds == 0  # served from the recorded image, nothing rebuilt
        async with mcp_client(server.url, token) as client:  # the token survives the restart
            assert text_of(await client.call_tool("add", {"a": 2, "b": 5})) == "7"
        # One workload key per server, minted once: a restart serves it with the same key.
        keys = await platform.db.run(
            lambda s: [k.revoked_at is None for k in s.scalars(select(ApiKey).where(ApiKey.kind == "workload"))]
        )
        assert keys == [True]
        await platform.mcp.delete(principal, project_id, "calc")
        assert platform.mcp.host.serving(project_id, "calc") is None
        revoked = await platform.db.run(
            lambda s: [k.revoked_at is not None for k in s.scalars(select(ApiKey).where(ApiKey.kind == "workload"))]
        )
        assert revoked == [True]  # the key goes with its server


async def test_deleting_a_project_stops_its_servers(tmp_path, settings, openbao):
    from caiplatform.db.models import McpServer
    from caiplatform.testing.users import bootstrap_admin, delete_project, new_project

    settings = settings.model_copy(update={"bao_addr": openbao.addr, "bao_token": openbao.root_token})
    async with Platform.embedded(tmp_path / "data", settings) as platform:
        admin = await bootstrap_admin(platform)
        project = await new_project(platform, "doomed")
        await platform.mcp.create(admin, project.id, McpServerCreate(name="calc"))
        await platform.mcp.publish_tool(admin, project.id, "calc", "add", McpToolPublish(handler=ADD))
        await platform.mcp.wait_idle()
        server = await platform.mcp.get(admin, project.id, "calc")
        assert server.status == "ready", server
        process = platform.mcp.host.serving(project.id, "calc").process
        assert platform.supervisor().get(process) is not None

        await delete_project(platform, project.id)

        assert platform.mcp.host.serving(project.id, "calc") is None
        assert platform.supervisor().get(process) is None
        http, url = http_to(server.url)
        async with http:
            try:
                await http.get(url.removesuffix("/mcp") + "/healthz", timeout=2)
                raise AssertionError("the MCP server outlived its project")
            except httpx.HTTPError:
                pass
        assert await platform.db.run(lambda s: s.scalar(select(McpServer.id).where(McpServer.project_id == project.id))) is None
        assert await platform.mcp.purge_project(project.id) == 0
