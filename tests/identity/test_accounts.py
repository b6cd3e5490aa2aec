"""Users and organizations over HTTP: creation rules, guards and their exact messages."""

from __future__ import annotations

from caiplatform.testing.http import ADMIN_EMAIL


async def test_create_user_returns_a_temporary_password_once(client, admin_headers):
    r = await client.post("/v1/users", headers=admin_headers, json={"email": "New.Person@Example.com"})
    assert r.status_code == 201
    body = r.json()
    assert body["user"]["email"] == "new.person@example.com"
    assert body["user"]["must_change_password"] is True and body["user"]["external"] is False
    assert len(body["temporary_password"]) >= 12 and body["note"]
    again = await client.post("/v1/users", headers=admin_headers, json={"email": "new.person@example.com"})
    assert again.status_code == 409
    listed = await client.get("/v1/users", headers=admin_headers)
    assert "temporary_password" not in listed.text and set(listed.json()) == {"users", "unowned_agents", "next_page_token"}


async def test_create_user_validation(client, admin_headers, world):
    bad = [
        ({"email": "nope"}, 400),
        ({"email": "x@example.com", "role": "root"}, 400),
        ({"email": "x@example.com", "password": "short"}, 400),
        ({"email": "x@example.com", "org_id": "not-a-uuid"}, 400),
    ]
    for body, status in bad:
        assert (await client.post("/v1/users", headers=admin_headers, json=body)).status_code == status, body
    r = await client.post("/v1/users", headers=world.headers["org_admin"], json={"email": "y@example.com", "role": "admin"})
    assert r.status_code == 403 and r.json()["error"] == "only a platform admin can create a platform admin"
    r = await client.post(
        "/v1/users", headers=world.headers["project_admin"], json={"email": "y@example.com", "org_id": world.ids["EMPTY_ORG"]}
    )
    assert r.status_code == 403 and r.json()["error"] == "creating in that organization requires administering it"
    r = await client.post("/v1/users", headers=world.headers["member"], json={"email": "y@example.com"})
    assert r.json()["error"] == "creating an account requires administering an organization or a project"


async def test_owed_password_change_gates_management_routes(client, world):
    headers = world.headers["owes_password"]
    r = await client.get("/v1/projects", headers=headers)
    assert r.status_code == 403 and r.json()["error"] == "password change required before using this API"
    assert (await client.get("/v1/auth/me", headers=headers)).json()["must_change_password"] is True


async def test_role_changes_and_last_admin_guards(client, admin_headers, settings):
    empty = await client.patch(f"/v1/users/{ADMIN_EMAIL}", headers=admin_headers, json={})
    assert empty.status_code == 400 and empty.json()["error"].startswith("nothing to update: ")
    own = await client.patch(f"/v1/users/{ADMIN_EMAIL}", headers=admin_headers, json={"role": "user"})
    assert own.status_code == 400
    assert own.json()["error"] == "cannot remove your own admin role - ask another admin to do it"
    automation = {"Authorization": f"Bearer {settings.automation_token}"}
    last = await client.patch(f"/v1/users/{ADMIN_EMAIL}", headers=automation, json={"role": "user"})
    assert last.status_code == 409 and last.json()["error"] == "cannot demote the last admin - promote another account first"
    assert (await client.delete(f"/v1/users/{ADMIN_EMAIL}", headers=automation)).status_code == 409
    assert (await client.delete(f"/v1/users/{ADMIN_EMAIL}", headers=admin_headers)).status_code == 400
    missing = await client.patch("/v1/users/nobody@example.com", headers=admin_headers, json={"role": "user"})
    assert missing.status_code == 404 and missing.json()["error"] == "user not found"


async def test_delete_and_reset_password(client, admin_headers, world):
    email = world.ids["TARGET_EMAIL"]
    reset = await client.post(f"/v1/users/{email}/reset-password", headers=admin_headers)
    assert reset.status_code == 200 and reset.json()["email"] == email and reset.json()["temporary_password"]
    r = await client.delete(f"/v1/users/{email}", headers=admin_headers)
    assert r.status_code == 200 and r.json()["deleted"] == email
    members = await client.get(f"/v1/projects/{world.ids['P']}/members", headers=admin_headers)
    assert email not in members.text


async def test_orgs(client, admin_headers, world):
    r = await client.post("/v1/orgs", headers=admin_headers, json={"slug": "  Acme ", "name": "Acme"})
    assert r.status_code == 201
    org = r.json()["org"]
    assert org["slug"] == "acme" and org["projects"] == 0 and org["users"] == 0
    assert (await client.post("/v1/orgs", headers=admin_headers, json={"slug": "acme", "name": "x"})).status_code == 409
    orgs = (await client.get("/v1/orgs", headers=admin_headers)).json()["orgs"]
    default = next(o for o in orgs if o["slug"] == "default")
    r = await client.delete(f"/v1/orgs/{default['id']}", headers=admin_headers)
    assert r.status_code == 403
    assert (await client.delete(f"/v1/orgs/{world.ids['ORG']}", headers=admin_headers)).status_code == 409
    r = await client.delete("/v1/orgs/nope", headers=admin_headers)
    assert r.status_code == 400 and r.json()["error"] == "invalid orgID: must be a UUID"
    r = await client.delete(f"/v1/orgs/{org['id']}", headers=admin_headers)
    assert r.status_code == 200 and r.json() == {"deleted": True, "org": "acme"}


async def test_org_members(client, admin_headers, world):
    base = f"/v1/orgs/{world.ids['ORG']}/members"
    email = world.ids["OWES_EMAIL"]
    r = await client.post(base, headers=admin_headers, json={"email": email})
    assert r.status_code == 201 and r.json()["member"]["role"] == "member"
    assert (await client.post(base, headers=admin_headers, json={"email": email})).status_code == 200
    assert (await client.post(base, headers=admin_headers, json={"email": email, "role": "admin"})).status_code == 409
    assert (await client.post(base, headers=admin_headers, json={"email": "ghost@example.com"})).status_code == 404
    members = (await client.get(base, headers=admin_headers)).json()["members"]
    only_admin = next(m for m in members if m["role"] == "admin")
    r = await client.patch(f"{base}/{only_admin['user_id']}", headers=admin_headers, json={"role": "member"})
    assert r.status_code == 409
    assert (await client.delete(f"{base}/{only_admin['user_id']}", headers=admin_headers)).status_code == 409
    user_id = next(m["user_id"] for m in members if m["email"] == email)
    r = await client.patch(f"{base}/{user_id}", headers=admin_headers, json={"role": "admin"})
    assert r.status_code == 200 and r.json()["member"]["role"] == "admin"
    # Two admins now: the first may go.
    r = await client.delete(f"{base}/{only_admin['user_id']}", headers=admin_headers)
    assert r.status_code == 200 and r.json()["deleted"] is True


async def test_org_admin_inherits_admin_live(client, admin_headers, world):
    project = world.ids["P"]
    view = (await client.get(f"/v1/projects/{project}", headers=world.headers["org_admin"])).json()
    assert view["your_role"] == "admin" and view["your_metadata_role"] == "admin"
    members = (await client.get(f"/v1/orgs/{world.ids['ORG']}/members", headers=admin_headers)).json()["members"]
    org_admin = next(m for m in members if m["role"] == "admin")
    await client.post(f"/v1/orgs/{world.ids['ORG']}/members", headers=admin_headers, json={"email": world.ids["TARGET_EMAIL"]})
    await client.patch(f"/v1/orgs/{world.ids['ORG']}/members/{world.ids['TARGET_ID']}", headers=admin_headers, json={"role": "admin"})
    await client.delete(f"/v1/orgs/{world.ids['ORG']}/members/{org_admin['user_id']}", headers=admin_headers)
    # No membership rows were involved: the inherited grant ends on the next request.
    assert (await client.get(f"/v1/projects/{project}", headers=world.headers["org_admin"])).status_code == 404


async def test_user_view_lists_projects_and_agents_within_the_callers_resource_grants(client, admin_headers, platform, world):
    async def user_agents(user_id):
        return [(world.ids["P"], "helper"), (world.ids["Q"], "other-agent")]

    platform.agent_hooks.user_agents = user_agents
    users = (await client.get("/v1/users", headers=world.headers["platform_admin"])).json()["users"]
    target = next(u for u in users if u["email"] == world.ids["TARGET_EMAIL"])
    assert target["projects"] == [f"p-{world.ids['TAG']}"]
    # A platform admin without grants sees accounts, not tenant workload names.
    assert target["agents"] == [] and target["agent_count"] == 0
    bg = next(u for u in users if u["email"].startswith("bg-"))
    assert bg["projects"] == [f"p-{world.ids['TAG']}"]  # a live break-glass grant
    users = (await client.get("/v1/users", headers=world.headers["break_glass"])).json()["users"]
    target = next(u for u in users if u["email"] == world.ids["TARGET_EMAIL"])
    assert target["agents"] == ["helper"] and target["agent_count"] == 1


async def test_only_failed_sign_ins_count_and_accept_shares_the_limit(client, clock):
    from caiplatform.testing.http import ADMIN_PASSWORD

    for _ in range(12):
        assert (await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})).status_code == 200
    for _ in range(10):
        assert (await client.post("/v1/invitations/accept", json={"token": "guessed", "password": "x" * 12})).status_code == 404
    limited = await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    assert limited.status_code == 429 and limited.json()["error"].startswith("too many sign-in attempts; try again in ")
    assert (await client.post("/v1/invitations/accept", json={"token": "guessed"})).status_code == 429
    clock.advance(minutes=15, seconds=1)
    assert (await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})).status_code == 200
