"""Hosted MCP servers over HTTP on the in-memory host: every route, role and quoted error."""

from __future__ import annotations

import pytest

from caiplatform.errors import PlatformError

ADD = '''
from caiplatform.mcp import tool

@tool
def add(a: int, b: int = 2) -> int:
    """Add two numbers."""
    return a + b
'''

GREET = '''
from caiplatform.mcp import tool, secret

@tool(credential_keys=["GREETING"])
def greet(name: str) -> str:
    """Greet someone with the project's greeting."""
    return f"{secret('GREETING')}, {name}"
'''


@pytest.fixture
async def project_id(platform):
    from sqlalchemy import select

    from caiplatform.db.models import Project

    return await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))


@pytest.fixture
def base(project_id):
    return f"/v1/projects/{project_id}/mcpservers"


async def ready(platform):
    await platform.mcp.wait_idle()


async def test_create_get_list_delete(client, admin_headers, base, platform):
    created = await client.post(base, headers=admin_headers, json={"name": "tools", "warm": 3})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == "tools" and body["status"] == "pending" and body["visibility"] == "private"
    assert body["expose"] == "" and body["tool_count"] == 0 and body["tool_names"] == []
    assert "url" not in body and "version" not in body
    got = await client.get(f"{base}/tools", headers=admin_headers)
    assert got.status_code == 200 and got.json()["mcp_server"]["name"] == "tools"
    listed = await client.get(base, headers=admin_headers)
    assert [s["name"] for s in listed.json()["mcpservers"]] == ["tools"]
    assert listed.json()["next_page_token"] == ""
    dup = await client.post(base, headers=admin_headers, json={"name": "tools"})
    assert dup.status_code == 409 and dup.json()["error"] == "an mcp server named tools already exists in this project"
    deleted = await client.delete(f"{base}/tools", headers=admin_headers)
    assert deleted.status_code == 200 and deleted.json() == {"name": "tools", "deleted": True}
    assert (await client.get(f"{base}/tools", headers=admin_headers)).status_code == 404


@pytest.mark.parametrize("name", ["", "Upper", "a" * 41, "1abc", "ends-", None, 5])
async def test_bad_names(client, admin_headers, base, name):
    response = await client.post(base, headers=admin_headers, json={"name": name})
    assert response.status_code == 400
    assert response.json()["error"] == "missing or invalid 'name' (must be a lowercase DNS label, <=40 chars)"


async def test_bad_expose(client, admin_headers, base):
    response = await client.post(base, headers=admin_headers, json={"name": "x", "expose": "public"})
    assert response.status_code == 400 and response.json()["error"] == '\'expose\' must be "" (cluster-local) or "apps"'


async def test_create_body_cap(client, admin_headers, base):
    response = await client.post(base, headers=admin_headers, json={"name": "x", "pad": "y" * 5000})
    assert response.status_code == 413


async def test_publish_builds_a_version_and_serves(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "calc"})
    published = await client.put(
        f"{base}/calc/tools/add", headers=admin_headers, json={"handler": ADD, "description": "adds", "schema": {"a": 1}}
    )
    assert published.status_code == 202, published.text
    body = published.json()
    assert body["server"] == "calc" and body["name"] == "add" and body["published"] is True and body["build_id"]
    await ready(platform)
    server = (await client.get(f"{base}/calc", headers=admin_headers)).json()["mcp_server"]
    assert server["status"] == "ready" and server["version"] == 1 and server["tool_names"] == ["add"]
    assert server["url"].endswith("/mcp") and server["image"].startswith("registry.local/cai-")
    tools = (await client.get(f"{base}/calc/tools", headers=admin_headers)).json()
    assert tools["server"] == "calc"
    (tool,) = tools["tools"]
    assert tool["credential_keys"] == tool["credentialKeys"] == [] and tool["schema"] == {"a": 1}
    assert tool["description"] == "adds" and tool["handler"] == ADD and tool["updated_at"]
    versions = (await client.get(f"{base}/calc/versions", headers=admin_headers)).json()["versions"]
    assert versions[0]["version"] == 1 and versions[0]["current"] is True
    assert versions[0]["image_digest"].startswith("sha256:") and "yanked" not in versions[0]


async def test_full_replace_clears_omitted_fields(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET, "description": "d", "credentialKeys": ["GREETING"]})
    await ready(platform)
    (first,) = (await client.get(f"{base}/s/tools", headers=admin_headers)).json()["tools"]
    assert first["description"] == "d" and first["credential_keys"] == first["credentialKeys"] == ["GREETING"]
    await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET})
    await ready(platform)
    (tool,) = (await client.get(f"{base}/s/tools", headers=admin_headers)).json()["tools"]
    assert tool["description"] == "" and tool["credential_keys"] == tool["credentialKeys"] == []


async def test_tool_errors(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    missing = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"description": "no handler"})
    assert missing.status_code == 400 and missing.json()["error"].startswith("missing 'handler': ")
    bad = await client.put(f"{base}/s/tools/_hidden", headers=admin_headers, json={"handler": ADD})
    assert bad.status_code == 400
    assert bad.json()["error"] == "invalid tool name (must be a lowercase identifier not starting with '_')"
    gone = await client.delete(f"{base}/s/tools/nothing", headers=admin_headers)
    assert gone.status_code == 404
    unknown_server = await client.put(f"{base}/nope/tools/add", headers=admin_headers, json={"handler": ADD})
    assert unknown_server.status_code == 404


async def test_a_broken_handler_fails_the_build_with_a_message(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": "def oops(:\n"})
    await ready(platform)
    server = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert server["status"] == "failed" and "does not compile" in server["message"]
    (version,) = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    # Document 2: "`current` moves on publish": the failed version is the current one; nothing serves.
    assert "image_digest" not in version and version["current"] is True
    assert "version" not in server and "url" not in server
    rollback = await client.post(f"{base}/s/versions/1:rollback", headers=admin_headers)
    assert rollback.status_code == 409 and "no recorded image" in rollback.json()["error"]


async def test_versions_rollback_and_yank(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET, "credential_keys": ["GREETING"]})
    await ready(platform)
    versions = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[0]["credential_keys"] == ["GREETING"] and versions[0]["tool_names"] == ["add", "greet"]

    yank_current = await client.post(f"{base}/s/versions/2:yank", headers=admin_headers)
    assert yank_current.status_code == 409
    builds_before = len(platform.mcp.host.builds)
    rolled = await client.post(f"{base}/s/versions/1:rollback", headers=admin_headers)
    assert rolled.status_code == 200
    assert rolled.json()["rolled_back"] is True and rolled.json()["version"] == 1 and rolled.json()["image"]
    assert len(platform.mcp.host.builds) == builds_before  # no rebuild
    server = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert server["version"] == 1
    yank = await client.post(f"{base}/s/versions/2:yank", headers=admin_headers)
    assert yank.status_code == 200 and yank.json() == {"server": "s", "version": 2, "yanked": True}
    listed = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert listed[0]["yanked"] is True and listed[0]["yanked_at"] and "yanked" not in listed[1]
    refused = await client.post(f"{base}/s/versions/2:rollback", headers=admin_headers)
    assert refused.status_code == 409
    unyank = await client.post(f"{base}/s/versions/2:unyank", headers=admin_headers)
    assert unyank.json() == {"server": "s", "version": 2, "yanked": False}
    assert (await client.post(f"{base}/s/versions/2:rollback", headers=admin_headers)).status_code == 200


async def test_current_moves_on_publish_and_rollback_while_version_says_what_serves(client, admin_headers, base, platform):
    def flags(versions):
        return {v["version"]: v["current"] for v in versions}

    await client.post(base, headers=admin_headers, json={"name": "s"})
    assert (await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})).status_code == 202
    # Read right after the publish, before its build ran: version 1 is already the current one.
    versions = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert flags(versions) == {1: True}
    building = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert building["status"] == "ready" or "version" not in building  # `version` is what serves
    await ready(platform)

    await client.put(f"{base}/s/tools/broken", headers=admin_headers, json={"handler": "def broken(:\n"})
    assert flags((await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]) == {2: True, 1: False}
    await ready(platform)
    server = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert server["status"] == "failed" and server["version"] == 1  # version 1 still serves
    assert flags((await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]) == {2: True, 1: False}
    assert (await client.post(f"{base}/s/versions/2:yank", headers=admin_headers)).status_code == 409
    assert (await client.post(f"{base}/s/versions/1:yank", headers=admin_headers)).status_code == 409

    assert (await client.post(f"{base}/s/versions/1:rollback", headers=admin_headers)).status_code == 200
    assert flags((await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]) == {2: False, 1: True}
    server = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert server["status"] == "ready" and server["version"] == 1


@pytest.mark.parametrize("version", ["0", "-1", "abc", "1.5"])
async def test_version_must_be_positive_integer(client, admin_headers, base, version):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    response = await client.post(f"{base}/s/versions/{version}:yank", headers=admin_headers)
    assert response.status_code == 400 and response.json()["error"] == "version must be a positive integer"


async def test_version_not_found_and_unknown_verb(client, admin_headers, base):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    assert (await client.post(f"{base}/s/versions/9:yank", headers=admin_headers)).json()["error"] == "no such version"
    assert (await client.post(f"{base}/s/versions/1:explode", headers=admin_headers)).status_code == 404


async def test_audit_rows(client, admin_headers, base, platform, project_id):
    from sqlalchemy import select

    from caiplatform.db.models import AuditEntry

    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    await client.delete(f"{base}/s/tools/add", headers=admin_headers)
    await ready(platform)
    await client.delete(f"{base}/s", headers=admin_headers)
    actions = await platform.db.run(
        lambda s: [a.action for a in s.scalars(select(AuditEntry).where(AuditEntry.project_id == project_id).order_by(AuditEntry.id))]
    )
    assert actions == ["mcpserver.create", "mcpserver.tool.publish", "mcpserver.tool.delete", "mcpserver.delete"]


async def test_anonymous_and_strangers(client, base):
    assert (await client.get(base)).status_code == 401
    assert (await client.post(base, json={"name": "x"})).status_code == 401


async def test_malformed_project_id(client, admin_headers):
    response = await client.get("/v1/projects/not-a-uuid/mcpservers", headers=admin_headers)
    assert response.status_code == 400


async def _bearer_for(platform, project_id, role: str | None) -> dict[str, str]:
    """A signed-in user holding `role` on the project (None: a user with no grant)."""
    import secrets

    from caiplatform.db.models import ProjectMember, User

    now = platform.clock.now()

    def run(session):
        user = User(email=f"{role or 'stranger'}-{secrets.token_hex(3)}@example.com", password_hash="unused",
                    role="user", must_change_password=False, created_at=now)
        session.add(user)
        session.flush()
        if role:
            session.add(ProjectMember(project_id=project_id, user_id=user.id, role=role, created_at=now))
        return user.id

    user_id = await platform.db.run(run)
    token, _ = platform.auth.tokens.issue(user_id, platform.clock.time())
    return {"Authorization": f"Bearer {token}"}


async def test_roles(client, admin_headers, base, platform, project_id):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    member = await _bearer_for(platform, project_id, "member")
    for path in ("", "/s", "/s/tools", "/s/versions"):
        assert (await client.get(f"{base}{path}", headers=member)).status_code == 200, path
    admin_only = [
        client.post(base, headers=member, json={"name": "t"}),
        client.delete(f"{base}/s", headers=member),
        client.put(f"{base}/s/tools/add", headers=member, json={"handler": ADD}),
        client.delete(f"{base}/s/tools/add", headers=member),
        client.post(f"{base}/s/versions/1:rollback", headers=member),
        client.post(f"{base}/s/versions/1:yank", headers=member),
        client.post(f"{base}/s/versions/1:unyank", headers=member),
        client.get(f"{base}/s/token", headers=member),
    ]
    for call in admin_only:
        response = await call
        assert response.status_code == 403, response.text
        assert response.json()["error"] == "this action requires the project admin role"
    stranger = await _bearer_for(platform, project_id, None)
    assert (await client.get(base, headers=stranger)).status_code == 404
    assert (await client.get(f"{base}/s", headers=stranger)).status_code == 404
    assert (await client.post(f"{base}/s/versions/1:yank")).status_code == 401
    # Nothing the refused calls asked for happened.
    versions = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert [(v["version"], v.get("yanked")) for v in versions] == [(1, None)]


async def test_publish_body_cap_is_one_mebibyte(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    padded = ADD + "#" * (900 * 1024) + "\n"
    assert (await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": padded})).status_code == 202
    too_big = ADD + "#" * (1024 * 1024) + "\n"
    response = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": too_big})
    assert response.status_code == 413
    await ready(platform)
    assert len((await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]) == 1


async def test_token_is_minted_once_and_kept(client, admin_headers, base, platform):
    created = await client.post(base, headers=admin_headers, json={"name": "s"})
    assert "token" not in created.json()
    token = (await client.get(f"{base}/s/token", headers=admin_headers)).json()
    assert token["server"] == "s"
    assert token["token"].startswith("cai_mcp_") and len(token["token"]) == 72
    int(token["token"].removeprefix("cai_mcp_"), 16)
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    assert (await client.get(f"{base}/s/token", headers=admin_headers)).json() == token
    (served,) = platform.mcp.host.serving.values()
    assert served.secret_env["CAI_MCP_AUTH_TOKEN"] == token["token"]
    assert served.secret_env["CAI_PROJECT_KEY"].startswith("cai_wl_")
    assert served.env["CAI_PROJECT_ID"] and served.env["PLATFORM_REQUEST_TIMEOUT_SECONDS"] == "300"
    assert "CAI_API_URL" in served.env


async def test_the_served_workload_key_reads_project_secrets_only(client, admin_headers, base, platform, project_id):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    (served,) = platform.mcp.host.serving.values()
    key = {"Authorization": f"Bearer {served.secret_env['CAI_PROJECT_KEY']}"}
    assert (await client.get(base, headers=key)).status_code == 403  # a workload key manages nothing
    await client.post(f"/v1/projects/{project_id}/secrets", headers=admin_headers, json={"name": "k", "value": "v"})
    other = (await client.post("/v1/projects", headers=admin_headers, json={"slug": "other", "name": "Other"})).json()
    other_id = other["project"]["id"]
    await client.post(f"/v1/projects/{other_id}/secrets", headers=admin_headers, json={"name": "k", "value": "theirs"})

    minted = await client.post(f"/v1/projects/{project_id}/secrets:issue-token", headers=key, json={})
    assert minted.status_code == 200, minted.text
    token, path = minted.json()["token"], minted.json()["read"]["path"]
    backend = platform.secrets.backend
    assert (await backend.read_with_token(token, path + "k")).value == "v"
    with pytest.raises(PlatformError):  # the token is scoped to its own project's secrets
        await backend.read_with_token(token, backend.path_prefix(other_id) + "k")
    refused = await client.post(f"/v1/projects/{other_id}/secrets:issue-token", headers=key, json={})
    assert refused.status_code == 404 and "token" not in refused.json(), refused.text  # no grant there: 404


async def test_version_verbs_are_audited(client, admin_headers, base, platform, project_id):
    from sqlalchemy import select

    from caiplatform.db.models import AuditEntry

    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET})
    await ready(platform)
    assert (await client.post(f"{base}/s/versions/1:rollback", headers=admin_headers)).status_code == 200
    assert (await client.post(f"{base}/s/versions/2:yank", headers=admin_headers)).status_code == 200
    assert (await client.post(f"{base}/s/versions/2:unyank", headers=admin_headers)).status_code == 200
    actions = await platform.db.run(
        lambda s: [a.action for a in s.scalars(select(AuditEntry).where(AuditEntry.project_id == project_id).order_by(AuditEntry.id))]
    )
    assert actions[-3:] == ["mcpserver.version.rollback", "mcpserver.version.yank", "mcpserver.version.unyank"]


async def test_version_route_without_a_verb_is_404(client, admin_headers, base):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    assert (await client.post(f"{base}/s/versions/1", headers=admin_headers)).status_code == 404
    unknown = await client.post(f"{base}/s/versions/1:promote", headers=admin_headers)
    assert unknown.status_code == 404 and unknown.json()["request_id"]


async def test_empty_bodies_get_the_field_errors(client, admin_headers, base):
    response = await client.post(base, headers=admin_headers)
    assert response.status_code == 400
    assert response.json()["error"] == "missing or invalid 'name' (must be a lowercase DNS label, <=40 chars)"
    await client.post(base, headers=admin_headers, json={"name": "s"})
    response = await client.put(f"{base}/s/tools/add", headers=admin_headers)
    assert response.status_code == 400 and response.json()["error"].startswith("missing 'handler': ")
    broken = await client.post(base, headers=admin_headers, content=b"{not json")
    assert broken.status_code == 400 and broken.json()["error"].startswith("invalid JSON body: ")


async def test_list_pages(client, admin_headers, base):
    for name in ("a", "b", "c"):
        await client.post(base, headers=admin_headers, json={"name": name})
    first = (await client.get(f"{base}?page_size=2", headers=admin_headers)).json()
    assert [s["name"] for s in first["mcpservers"]] == ["a", "b"] and first["next_page_token"]
    second = (await client.get(f"{base}?limit=2&page_token={first['next_page_token']}", headers=admin_headers)).json()
    assert [s["name"] for s in second["mcpservers"]] == ["c"] and second["next_page_token"] == ""
    assert (await client.get(f"{base}?page_size=201", headers=admin_headers)).status_code == 400


async def test_decorator_declared_keys_count_for_the_version(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET})
    await ready(platform)
    (tool,) = (await client.get(f"{base}/s/tools", headers=admin_headers)).json()["tools"]
    assert tool["credential_keys"] == []  # the record keeps what was sent
    (version,) = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert version["credential_keys"] == ["GREETING"]
    (served,) = platform.mcp.host.serving.values()
    assert served.env["CAI_MCP_CREDENTIAL_KEYS"] == '["GREETING"]'


async def test_delete_removes_tools_versions_and_the_deployment(client, admin_headers, base, platform):
    from sqlalchemy import func, select

    from caiplatform.db.models import McpTool, McpVersion

    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    assert platform.mcp.host.serving
    assert (await client.delete(f"{base}/s", headers=admin_headers)).status_code == 200
    counts = await platform.db.run(
        lambda s: (s.scalar(select(func.count()).select_from(McpTool)), s.scalar(select(func.count()).select_from(McpVersion)))
    )
    assert counts == (0, 0) and not platform.mcp.host.serving
    # The name is free again, with a fresh history.
    assert (await client.post(base, headers=admin_headers, json={"name": "s"})).status_code == 201
    assert (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"] == []


async def test_delete_tool_rebuilds_without_it(client, admin_headers, base, platform):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": ADD})
    published = await client.put(f"{base}/s/tools/greet", headers=admin_headers, json={"handler": GREET})
    await ready(platform)
    deleted = await client.delete(f"{base}/s/tools/greet", headers=admin_headers)
    assert deleted.status_code == 202
    body = deleted.json()
    assert body["server"] == "s" and body["name"] == "greet" and body["deleted"] is True and body["note"]
    assert body["build_id"] and body["build_id"] != published.json()["build_id"]
    await ready(platform)
    server = (await client.get(f"{base}/s", headers=admin_headers)).json()["mcp_server"]
    assert server["status"] == "ready" and server["tool_names"] == ["add"] and server["tool_count"] == 1
    versions = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert versions[0]["version"] == 3 and versions[0]["tool_names"] == ["add"] and versions[0]["current"] is True
    assert (await client.delete(f"{base}/s/tools/greet", headers=admin_headers)).status_code == 404


async def test_resume_serves_again_and_finishes_unfinished_builds(client, admin_headers, base, platform, project_id):
    from sqlalchemy import select

    from caiplatform.db.models import McpServer

    for name in ("ok", "broken", "midway"):
        await client.post(base, headers=admin_headers, json={"name": name})
        await client.put(f"{base}/{name}/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)

    def set_status(session):
        for server in session.scalars(select(McpServer).where(McpServer.project_id == project_id)):
            if server.name == "broken":
                server.status, server.message = "failed", "build failed: earlier"
            if server.name == "midway":
                server.status = "building"

    await platform.db.run(set_status)
    platform.mcp.host.serving.clear()  # what a restarted host knows
    builds = len(platform.mcp.host.builds)
    await platform.mcp.resume()
    await ready(platform)
    assert {server for (_, server) in platform.mcp.host.serving} == {"ok", "broken", "midway"}
    assert len(platform.mcp.host.builds) == builds + 1  # only the unfinished one builds again
    status = {s["name"]: (s["status"], s.get("message")) for s in (await client.get(base, headers=admin_headers)).json()["mcpservers"]}
    assert status == {"ok": ("ready", None), "broken": ("failed", "build failed: earlier"), "midway": ("ready", None)}


async def test_resume_leaves_alone_a_server_its_host_still_serves(client, admin_headers, base, platform, monkeypatch):
    """A cluster's MCP server outlives the platform with its rollout's key: a restart does not roll it again."""
    for name in ("kept", "gone"):
        await client.post(base, headers=admin_headers, json={"name": name})
        await client.put(f"{base}/{name}/tools/add", headers=admin_headers, json={"handler": ADD})
    await ready(platform)
    asked = []

    async def still_serving(project_id, project_short, server, version):
        asked.append((server, version))
        return "http://kept-mcp.cluster/mcp" if server == "kept" else None

    monkeypatch.setattr(platform.mcp.host, "still_serving", still_serving)
    platform.mcp.host.serving.clear()  # what a restarted host knows
    await platform.mcp.resume()
    await ready(platform)
    assert sorted(asked) == [("gone", 1), ("kept", 1)]
    assert {server for (_, server) in platform.mcp.host.serving} == {"gone"}
    status = {s["name"]: s["status"] for s in (await client.get(base, headers=admin_headers)).json()["mcpservers"]}
    assert status == {"kept": "ready", "gone": "ready"}


@pytest.mark.parametrize(
    "handler",
    [
        "from mcp_helper import tool\n\n@tool\ndef add(a: int) -> int:\n    return a\n",
        "from cai.mcp import tool, secret\n\n@tool\ndef add(a: int) -> int:\n    return a\n",
        "import mcp_tools\n\n@mcp_tools.tool\ndef add(a: int) -> int:\n    return a\n",
        "@tool\ndef add(a: int) -> int:\n    return a\n",
    ],
)
async def test_a_handler_that_imports_another_helper_is_told_which_module_to_import(client, admin_headers, base, handler):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    response = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": handler})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.startswith("tools/add.py ") and "`from caiplatform.mcp import tool, secret`" in error
    assert "@tool(credential_keys=[...])" in error and "secret(name)" in error
    versions = (await client.get(f"{base}/s/versions", headers=admin_headers)).json()["versions"]
    assert versions == []  # refused: nothing published


@pytest.mark.parametrize(
    "handler",
    [
        "import caiplatform.mcp\n\n@caiplatform.mcp.tool\ndef add(a: int) -> int:\n    return a\n",
        "from caiplatform import mcp as helper\n\n@helper.tool(credential_keys=['K'])\ndef add(a: int) -> int:\n    return a\n",
        "def add(a: int) -> int:\n    return a\n",
    ],
)
async def test_the_helper_module_in_any_spelling_is_accepted(client, admin_headers, base, handler):
    await client.post(base, headers=admin_headers, json={"name": "s"})
    response = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": handler})
    assert response.status_code == 202, response.text


GUARDED = [
    # the issue's handler: the first import succeeds when the tool is loaded, the fallback never runs
    "try:\n    from caiplatform.mcp import tool\nexcept ImportError:\n    from cai_mcp import tool\n\n"
    "@tool\ndef add(a: int) -> int:\n    return a\n",
    "try:\n    import caiplatform.mcp as helper\nexcept ModuleNotFoundError:\n    import cai_mcp as helper\n\n"
    "@helper.tool\ndef add(a: int) -> int:\n    return a\n",
    "import sys\nif sys.version_info < (3,):\n    from cai_mcp import tool\nelse:\n    from caiplatform.mcp import tool\n\n"
    "@tool\ndef add(a: int) -> int:\n    return a\n",
    "from caiplatform.mcp import tool\n\n@tool\ndef add(a: int) -> int:\n    from elsewhere import secret\n    return a\n",
]


@pytest.mark.parametrize("handler", GUARDED)
async def test_a_handler_whose_other_helper_import_is_guarded_is_published(client, admin_headers, base, handler):
    """Only what certainly fails at load is refused at publish: an import the module survives is not."""
    await client.post(base, headers=admin_headers, json={"name": "s"})
    response = await client.put(f"{base}/s/tools/add", headers=admin_headers, json={"handler": handler})
    assert response.status_code == 202, response.text


async def _upstream(tag: str):  # type: ignore[no-untyped-def]
    """A loopback HTTP server that answers every request with `tag` and the path it was asked for (a
    replica's MCP process, as far as the platform's route can tell)."""
    import asyncio

    async def answer(reader, writer):  # type: ignore[no-untyped-def]
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        if length:
            await reader.readexactly(length)
        path = head.split(b" ", 2)[1]
        body = tag.encode() + b" " + path
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"


async def test_the_url_clients_get_stays_the_same_across_versions_and_replicas(client, admin_headers, base, platform,
                                                                              project_id):
    """A host whose servers listen on a replica's loopback port hands out the platform's route to the
    server: a new version, or another replica taking the server over (a new `url` and `owner` recorded),
    changes where the route goes, never the address the MCP client holds."""
    from sqlalchemy import update

    from caiplatform.db.models import McpServer, Project

    platform.mcp.api_url = "http://127.0.0.1:8080"
    platform.mcp.host.routes_through_platform = True  # as the local host's servers do
    first, first_url = await _upstream("replica-a")
    second, second_url = await _upstream("replica-b")
    try:
        await client.post(base, headers=admin_headers, json={"name": "calc"})
        await client.put(f"{base}/calc/tools/add", headers=admin_headers, json={"handler": ADD})
        await ready(platform)
        short = await platform.db.run(lambda s: s.get(Project, project_id).short)

        async def served_by(url: str, owner: str) -> tuple[str, str]:
            await platform.db.run(lambda s: s.execute(update(McpServer).where(McpServer.name == "calc")
                                                      .values(url=url, owner=owner)))
            view = (await client.get(f"{base}/calc", headers=admin_headers)).json()["mcp_server"]
            path = view["url"].removeprefix("http://127.0.0.1:8080")
            answer = await client.post(path, content=b'{"jsonrpc":"2.0"}', headers={"Authorization": "Bearer t"})
            return view["url"], answer.text

        url_a, answer_a = await served_by(first_url, "replica-a")
        assert url_a == f"http://127.0.0.1:8080/mcp/{short}/calc/mcp" and answer_a == "replica-a /mcp"
        url_b, answer_b = await served_by(second_url, "replica-b")  # taken over by another replica
        assert url_b == url_a and answer_b == "replica-b /mcp"
        health = await client.get(f"/mcp/{short}/calc/healthz")
        assert health.text == "replica-b /healthz"
        assert (await client.get(f"/mcp/{short}/nope/mcp")).status_code == 404
        assert (await client.get("/mcp/other/calc/mcp")).status_code == 404
    finally:
        first.close()
        second.close()
