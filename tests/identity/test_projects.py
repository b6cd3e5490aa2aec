"""Projects and their members, break-glass, invitations, cloud mapping, quota, audit and search."""

from __future__ import annotations

import uuid


async def test_create_project_view_and_immutable_short(client, admin_headers, platform):
    r = await client.post("/v1/projects", headers=admin_headers, json={"slug": "Alpha", "name": "Alpha team"})
    assert r.status_code == 201, r.text
    project = r.json()["project"]
    assert project["slug"] == "alpha" and project["namespace"] == f"cai-p-{project['short']}"
    assert project["your_role"] == "admin" and project["your_metadata_role"] == "admin"  # bootstrap admin is org admin
    assert "warning" not in r.json()
    steps = platform.projects.provisioner.steps[project["id"]]
    assert steps == {"namespace", "quota", "network_policy", "model_credential", "cache_access_user"}
    renamed = await client.patch(f"/v1/projects/{project['id']}", headers=admin_headers, json={"slug": "beta"})
    assert renamed.status_code == 200
    assert renamed.json()["project"]["short"] == project["short"] and renamed.json()["project"]["slug"] == "beta"
    same = await client.patch(f"/v1/projects/{project['id']}", headers=admin_headers, json={"name": "Alpha team"})
    assert same.json()["note"] == "nothing changed"
    assert (await client.post("/v1/projects", headers=admin_headers, json={"slug": "beta"})).status_code == 409
    assert (await client.post("/v1/projects", headers=admin_headers, json={"slug": "default"})).status_code == 409
    bad = await client.get("/v1/projects/not-a-uuid", headers=admin_headers)
    assert bad.status_code == 400 and bad.json()["error"] == "malformed project id: must be a UUID"
    assert (await client.get(f"/v1/projects/{uuid.uuid4()}", headers=admin_headers)).status_code == 404
    r = await client.delete(f"/v1/projects/{project['id']}", headers=admin_headers)
    assert r.json() == {"deleted": True, "project": "beta"}


async def test_provisioning_failures_are_warnings(client, admin_headers, platform):
    platform.projects.provisioner.fail = {"network_policy": "no CNI"}
    r = await client.post("/v1/projects", headers=admin_headers, json={"slug": "warned"})
    assert r.status_code == 201
    assert "network_policy: no CNI" in r.json()["warning"]


async def test_platform_admin_outside_own_org_gets_a_note(client, world):
    r = await client.post(
        "/v1/projects", headers=world.headers["platform_admin"], json={"slug": "elsewhere", "org_id": world.ids["ORG"]}
    )
    assert r.status_code == 201 and "note" in r.json()
    assert "your_role" not in r.json()["project"] and r.json()["project"]["your_metadata_role"] == "admin"
    r = await client.post("/v1/projects", headers=world.headers["project_admin"], json={"slug": "nope"})
    assert r.status_code == 403 and r.json()["error"] == "creating a project requires the org admin role"


async def test_default_project_and_agents_hook(client, admin_headers, platform, world):
    projects = (await client.get("/v1/projects", headers=admin_headers)).json()["projects"]
    default = next(p for p in projects if p["slug"] == "default")
    r = await client.delete(f"/v1/projects/{default['id']}", headers=admin_headers)
    assert r.status_code == 403 and r.json()["error"] == "the default project cannot be deleted"

    async def agents(project_id):
        return ["helper"] if project_id == world.ids["P"] else []

    platform.agent_hooks.project_agents = agents
    r = await client.delete(f"/v1/projects/{world.ids['P']}", headers=admin_headers)
    assert r.status_code == 409 and r.json()["error"].startswith("project still has agents")


async def test_members_and_last_admin_guard(client, world):
    base = f"/v1/projects/{world.ids['P']}/members"
    admin = world.headers["project_admin"]
    members = (await client.get(base, headers=world.headers["member"])).json()["members"]
    kinds = {(m["kind"], m.get("break_glass", False)) for m in members}
    assert ("service_account", False) in kinds and ("user", True) in kinds
    padmin = next(m for m in members if m["role"] == "admin" and m["kind"] == "user" and not m.get("break_glass"))
    last = await client.patch(f"{base}/{padmin['user_id']}", headers=admin, json={"role": "member"})
    assert last.status_code == 409 and last.json()["error"] == "this is the project's only admin - promote someone else first"
    assert (await client.delete(f"{base}/{padmin['user_id']}", headers=admin)).status_code == 409
    r = await client.post(base, headers=admin, json={"email": "ghost@example.com"})
    assert r.status_code == 404 and r.json()["error"] == "no account exists for ghost@example.com - invite them instead"
    assert (await client.post(base, headers=admin, json={"email": "bad"})).status_code == 400
    r = await client.post(base, headers=admin, json={"email": world.ids["OTHER_EMAIL"], "role": "owner"})
    assert r.status_code == 400 and r.json()["error"] == "role must be admin or member"
    r = await client.post(base, headers=admin, json={"email": world.ids["OTHER_EMAIL"], "role": "admin"})
    assert r.status_code == 201 and r.json()["member"]["role"] == "admin"
    assert (await client.post(base, headers=admin, json={"email": world.ids["OTHER_EMAIL"]})).status_code == 409
    r = await client.patch(f"{base}/{padmin['user_id']}", headers=admin, json={"role": "member"})
    assert r.status_code == 200 and r.json() == {"user_id": padmin["user_id"], "role": "member"}
    r = await client.patch(f"{base}/service-accounts/{world.ids['SA2']}", headers=world.headers["org_admin"], json={"role": "admin"})
    assert r.json() == {"service_account_id": world.ids["SA2"], "role": "admin"}


async def test_break_glass_rules_and_expiry(client, world, clock):
    base = f"/v1/projects/{world.ids['P']}"
    admin = world.headers["platform_admin"]
    assert (await client.get(f"{base}/service-accounts", headers=admin)).status_code == 403  # metadata only
    short = await client.post(f"{base}/break-glass", headers=admin, json={"reason": "short"})
    assert short.status_code == 400
    long = await client.post(f"{base}/break-glass", headers=admin, json={"reason": "investigating", "minutes": 1441})
    assert long.status_code == 400
    r = await client.post(f"{base}/break-glass", headers=admin, json={"reason": "investigating an outage", "minutes": 30})
    assert r.status_code == 201
    grant = r.json()["grant"]
    assert grant["break_glass"] is True and grant["role"] == "admin" and grant["reason"] == "investigating an outage"
    assert "expired" not in grant
    assert (await client.get(f"{base}/service-accounts", headers=admin)).status_code == 200
    again = await client.post(f"{base}/break-glass", headers=admin, json={"reason": "investigating again"})
    assert again.status_code == 403
    clock.advance(minutes=31)
    assert (await client.get(f"{base}/service-accounts", headers=admin)).status_code == 403
    members = (await client.get(f"{base}/members", headers=world.headers["member"])).json()["members"]
    history = [m for m in members if m["user_id"] == grant["user_id"]]
    assert history and history[0]["expired"] is True
    audit = (await client.get(f"{base}/audit", headers=world.headers["member"])).json()["entries"]
    assert audit[0]["action"] == "project.break-glass"


async def test_invitation_lifecycle(client, world, clock, settings):
    base = f"/v1/projects/{world.ids['P']}/invitations"
    admin = world.headers["project_admin"]
    r = await client.post(base, headers=admin, json={"email": "guest@example.com", "role": "member"})
    assert r.status_code == 201
    invitation = r.json()["invitation"]
    token = invitation["token"]
    assert invitation["accept_url"] == f"/invite/{token}" and invitation["state"] == "open"
    listed = (await client.get(base, headers=world.headers["member"])).json()["invitations"]
    assert "token" not in listed[0] and "accept_url" not in listed[0]
    preview = await client.get(f"/v1/invitations/{token}")
    assert preview.status_code == 200
    assert preview.json() == {
        "project_name": "P", "project_slug": f"p-{world.ids['TAG']}", "email": "guest@example.com", "role": "member",
        "expires_at": invitation["expires_at"], "account_exists": False,
    }
    weak = await client.post("/v1/invitations/accept", json={"token": token, "password": "short"})
    assert weak.status_code == 400 and weak.json()["error"] == "password must be at least 12 characters"
    ok = await client.post("/v1/invitations/accept", json={"token": token, "password": "guest password 123"})
    assert ok.status_code == 200
    assert ok.json()["accepted"] is True and ok.json()["project_id"] == world.ids["P"] and ok.json()["role"] == "member"
    assert (await client.post("/v1/invitations/accept", json={"token": token, "password": "x" * 12})).status_code == 410
    assert (await client.get(f"/v1/invitations/{token}")).status_code == 410
    assert (await client.get("/v1/invitations/garbage")).status_code == 404
    login = await client.post("/v1/auth/login", json={"email": "guest@example.com", "password": "guest password 123"})
    assert login.status_code == 200
    guest = {"Authorization": f"Bearer {login.json()['token']}"}
    members = (await client.get(f"/v1/projects/{world.ids['P']}/members", headers=guest)).json()["members"]
    assert next(m for m in members if m["email"] == "guest@example.com")["external"] is True
    # An existing account is granted directly; a member already is 409.
    direct = await client.post(base, headers=admin, json={"email": world.ids["OTHER_EMAIL"], "role": "member"})
    assert direct.status_code == 201 and "member" in direct.json() and "invitation" not in direct.json()
    assert (await client.post(base, headers=admin, json={"email": "guest@example.com"})).status_code == 409
    # Revoked and expired links are 410.
    revoked = (await client.post(base, headers=admin, json={"email": "r@example.com"})).json()["invitation"]
    assert (await client.delete(f"{base}/{revoked['id']}", headers=admin)).status_code == 200
    assert (await client.get(f"/v1/invitations/{revoked['token']}")).status_code == 410
    expiring = (await client.post(base, headers=admin, json={"email": "late@example.com"})).json()["invitation"]
    clock.advance(days=7, seconds=1)
    assert (await client.get(f"/v1/invitations/{expiring['token']}")).status_code == 410
    automation = {"Authorization": f"Bearer {settings.automation_token}"}  # session tokens are past 12 hours
    states = {i["email"]: i["state"] for i in (await client.get(base, headers=automation)).json()["invitations"]}
    assert states == {
        "guest@example.com": "accepted", "r@example.com": "revoked", "late@example.com": "expired",
        f"invitee-{world.ids['TAG']}@example.com": "expired",
    }


async def test_cloud_mapping(client, world, platform):
    base = f"/v1/projects/{world.ids['P']}/platform-cloud"
    admin = world.headers["project_admin"]
    r = await client.post("/v1/projects", headers=world.headers["org_admin"], json={"slug": f"m-{world.ids['TAG']}"})
    fresh = r.json()["project"]["id"]
    assert (await client.get(f"/v1/projects/{fresh}/platform-cloud", headers=world.headers["org_admin"])).json()["mapped"] is True
    assert (await client.put(base, headers=admin, json={})).status_code == 400
    mapped = await client.put(base, headers=admin, json={"provider": "local", "credential": "my-cred"})
    assert mapped.status_code == 200 and mapped.json()["mapping"]["credential"] == "my-cred"
    unmapped = await client.delete(base, headers=admin)
    assert unmapped.json()["mapped"] is False and unmapped.json()["mapping"] is None
    settings = await platform.db.run(lambda s: s.get(__import__("caiplatform.db.models", fromlist=["Project"]).Project, world.ids["P"]).settings)
    assert "platform_cloud" in settings and settings["platform_cloud"] is None


async def test_quota_from_runtime_usage(client, world, platform):
    async def usage(namespace):
        return {"pods": 5, "requests.cpu": 2500, "requests.memory": 512 * 2**20}

    platform.projects.usage = usage
    body = (await client.get(f"/v1/projects/{world.ids['P']}/quota", headers=world.headers["member"])).json()
    assert set(body) == {"project", "namespace", "quotas", "note"}
    entries = {q["resource"]: q for q in body["quotas"]}
    assert entries["pods"]["used"] == "5" and entries["pods"]["hard"] == "50" and entries["pods"]["used_pct"] == 10
    assert entries["requests.cpu"]["used"] == "2500m" and entries["requests.cpu"]["used_pct"] == 25
    assert entries["requests.memory"]["used"] == "512Mi" and entries["requests.memory"]["used_pct"] == 2
    assert entries["services"]["hard"] == "60"  # the fallback of a project recorded without quota settings
    # Document 2: `display` is the label alone, the numbers stay in used/hard/used_pct.
    assert {r: q["display"] for r, q in entries.items()} == {
        "pods": "Running instances",
        "services": "Services",
        "requests.cpu": "CPU (reserved)",
        "requests.memory": "Memory (reserved)",
        "limits.cpu": "CPU (max)",
        "limits.memory": "Memory (max)",
    }


async def test_quota_unlimited_hard(client, admin_headers, platform):
    project = (await client.post("/v1/projects", headers=admin_headers, json={"slug": "unlimited"})).json()["project"]

    def unlimited(session):
        from caiplatform.db.models import Project

        row = session.get(Project, project["id"])
        row.settings = {**row.settings, "quota": {"pods": "0"}}

    await platform.db.run(unlimited)

    async def usage(namespace):
        return {"pods": 7}

    platform.projects.usage = usage
    body = (await client.get(f"/v1/projects/{project['id']}/quota", headers=admin_headers)).json()
    assert body["quotas"] == [
        {"resource": "pods", "used": "7", "hard": "0", "used_pct": 0, "display": "Running instances"}
    ]


async def test_audit_is_newest_first_and_paged(client, world):
    admin = world.headers["project_admin"]
    for i in range(3):
        await client.post(f"/v1/projects/{world.ids['P']}/service-accounts", headers=admin, json={"name": f"bot{i}"})
    first = (await client.get(f"/v1/projects/{world.ids['P']}/audit?page_size=2", headers=admin)).json()
    assert [e["target"].split("@")[0] for e in first["entries"]] == ["bot2", "bot1"]
    assert set(first["entries"][0]) == {"ts", "actor", "action", "target", "detail"}
    second = (await client.get(f"/v1/projects/{world.ids['P']}/audit?page_size=2&page_token={first['next_page_token']}", headers=admin)).json()
    assert second["entries"][0]["target"].startswith("bot0")


async def test_search_matches_contents_only_with_resource_authority(client, world):
    member = (await client.get("/v1/search?q=ROBOT", headers=world.headers["member"])).json()["results"]
    assert {r["name"] for r in member if r["kind"] == "service_account"} == {"robot", "robot2"}
    admin = (await client.get("/v1/search?q=robot", headers=world.headers["platform_admin"])).json()["results"]
    assert admin == []
    projects = (await client.get(f"/v1/search?q=p-{world.ids['TAG']}", headers=world.headers["platform_admin"])).json()
    assert [r["kind"] for r in projects["results"]] == ["project"]
    assert set(projects["results"][0]) == {"kind", "name", "project", "project_short", "route", "subtitle"}
    other = (await client.get("/v1/search?q=robot", headers=world.headers["other_member"])).json()["results"]
    assert other == []


async def test_the_default_project_is_provisioned_at_start(platform, client, admin_headers):
    projects = (await client.get("/v1/projects", headers=admin_headers)).json()["projects"]
    default = next(p for p in projects if p["slug"] == "default")
    assert len(platform.projects.provisioner.steps[default["id"]]) == 5
    assert await platform.projects.provision_unrecorded() == 0


async def test_search_secrets_by_name_and_mcp_servers(client, world):
    base = f"/v1/projects/{world.ids['P']}"
    admin = world.headers["project_admin"]
    assert (await client.post(f"{base}/secrets", headers=admin, json={"name": "stripe-key", "value": "sk-findme"})).status_code == 201
    assert (await client.post(f"{base}/mcpservers", headers=admin, json={"name": "stripe-tools"})).status_code == 201
    results = (await client.get("/v1/search?q=stripe", headers=world.headers["member"])).json()["results"]
    assert {(r["kind"], r["name"]) for r in results} == {("mcp_server", "stripe-tools"), ("secret", "stripe-key")}
    # Secrets match by name only, never by value; nothing is visible without resource authority.
    assert (await client.get("/v1/search?q=findme", headers=world.headers["member"])).json()["results"] == []
    assert (await client.get("/v1/search?q=stripe", headers=world.headers["platform_admin"])).json()["results"] == []
    only = (await client.get(f"/v1/search?q=stripe&project={world.ids['Q']}", headers=world.headers["member"])).json()
    assert only["results"] == []
