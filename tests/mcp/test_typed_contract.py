"""The typed contract of the MCP server routes (issue 19): create ignores other fields silently (the
spec says so); a tool publish refuses an unknown field by name and builds nothing."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest
from caiplatform.models.mcp import McpServer, McpServerCreate, McpToolPublish

from .test_mcp_service import ADD

pytestmark = pytest.mark.anyio


@pytest.fixture
async def project_id(platform):
    from sqlalchemy import select

    from caiplatform.db.models import Project

    return await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))


@pytest.fixture
def base(project_id):
    return f"/v1/projects/{project_id}/mcpservers"


async def test_create_ignores_other_fields_silently(client, admin_headers, base):
    r = await client.post(base, headers=admin_headers, json={"name": "s", "min_instances": 2, "expose": ""})
    assert r.status_code == 201 and r.json()["name"] == "s" and "min_instances" not in r.json()


async def test_a_publish_with_an_unknown_field_is_refused_and_builds_nothing(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    builds = len(platform.mcp.host.builds)
    r = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD, "credential_key": ["K"]})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "credential_key"'
    assert (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"] == []
    assert len(platform.mcp.host.builds) == builds


async def test_both_spellings_of_credential_keys_and_the_schema_round_trip(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    body = {"handler": ADD, "schema": {"type": "object"}, "credentialKeys": ["K"]}
    assert (await client.put(f"{base}/s/tools/add", headers=admin_headers, json=body)).status_code == 202
    await platform.mcp.wait_idle()
    (tool,) = (await client.get(f"{base}/s/tools", headers=admin_headers)).json()["tools"]
    assert tool["schema"] == {"type": "object"} and tool["credential_keys"] == tool["credentialKeys"] == ["K"]


async def test_the_library_takes_and_returns_models(platform, project_id):
    from caiplatform.principal import Principal

    automation = Principal.automation()
    created = await platform.mcp.create(automation, project_id, McpServerCreate(name="lib"))
    assert isinstance(created, McpServer) and created.status == "pending" and created.tool_count == 0
    published = await platform.mcp.publish_tool(automation, project_id, "lib", "add", McpToolPublish(handler=ADD))
    assert published.published and published.build_id
    await platform.mcp.wait_idle()
    assert (await platform.mcp.get(automation, project_id, "lib")).tool_names == ["add"]
    assert [s.name for s in (await platform.mcp.list(automation, project_id)).mcpservers] == ["lib"]


def test_the_request_models_carry_the_spec_messages():
    with pytest.raises(BadRequest, match="lowercase DNS label"):
        McpServerCreate.parse({"name": "Bad_Name"})
    with pytest.raises(BadRequest, match="'expose' must be"):
        McpServerCreate.parse({"name": "ok", "expose": "public"})
    with pytest.raises(BadRequest, match="missing 'handler'"):
        McpToolPublish.parse({})
    assert McpToolPublish.parse({"handler": ADD, "credentialKeys": ["A", "A"]}).credential_keys == ["A"]
