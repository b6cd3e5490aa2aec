"""Personal keys, service accounts and their keys, workload keys: one-time secrets, liveness, expiry
through the injectable clock, and the limits of machine credentials."""

from __future__ import annotations

from caiplatform.services.access import SERVICE_ACCOUNT_LIMIT, WORKLOAD_KEY_LIMIT


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_personal_key_lifecycle(client, world):
    me = world.headers["member"]
    r = await client.post("/v1/users/me/keys", headers=me, json={"display_name": "laptop"})
    assert r.status_code == 201
    created = r.json()
    assert set(created) == {"key", "secret", "note"}
    key = created["key"]
    assert created["secret"].startswith(f"cai_{key['key_id']}_") and key["live"] is True and key["kind"] == "personal"
    assert "expires_at" not in key
    # The key acts as its user, live.
    assert (await client.get(f"/v1/projects/{world.ids['P']}", headers=bearer(created["secret"]))).status_code == 200
    listed = (await client.get("/v1/users/me/keys", headers=me)).json()["keys"]
    assert [k["key_id"] for k in listed] == [key["key_id"]] and created["secret"] not in str(listed)
    assert "last_used_at" in listed[0]
    other = await client.delete(f"/v1/users/me/keys/{key['key_id']}", headers=world.headers["project_admin"])
    assert other.status_code == 404
    revoked = await client.delete(f"/v1/users/me/keys/{key['key_id']}", headers=me)
    assert revoked.status_code == 200 and revoked.json()["revoked"] == key["key_id"]
    assert (await client.get("/v1/projects", headers=bearer(created["secret"]))).status_code == 401
    listed = (await client.get("/v1/users/me/keys", headers=me)).json()["keys"]
    assert listed[0]["live"] is False and "revoked_at" in listed[0]


async def test_key_expiry_rules_and_clock(client, world, clock):
    me = world.headers["member"]
    for days in (-1, 3651, 1.5, "7", True):
        r = await client.post("/v1/users/me/keys", headers=me, json={"display_name": "x", "expires_in_days": days})
        assert r.status_code == 400, days
    r = await client.post("/v1/users/me/keys", headers=me, json={"display_name": "day", "expires_in_days": 1})
    secret = r.json()["secret"]
    assert r.json()["key"]["expires_at"]
    clock.advance(hours=23)
    assert (await client.get("/v1/projects", headers=bearer(secret))).status_code == 200
    clock.advance(hours=2)
    assert (await client.get("/v1/projects", headers=bearer(secret))).status_code == 401


async def test_service_accounts(client, world):
    base = f"/v1/projects/{world.ids['P']}/service-accounts"
    admin = world.headers["project_admin"]
    bad = await client.post(base, headers=admin, json={"name": "Not_A_Label"})
    assert bad.status_code == 400
    r = await client.post(base, headers=admin, json={"name": "deployer", "description": "CI", "role": "admin"})
    assert r.status_code == 201
    sa = r.json()["service_account"]
    project_short = (await client.get(f"/v1/projects/{world.ids['P']}", headers=admin)).json()["short"]
    assert sa["email"] == f"deployer@{project_short}.cai.local" and sa["display_name"] == "CI"
    assert sa["role"] == "admin" and sa["disabled"] is False
    key = (await client.post(f"{base}/deployer/keys", headers=admin, json={"display_name": "ci"})).json()
    sa_headers = bearer(key["secret"])
    # Its authority: this project's contents only.
    assert (await client.get(base, headers=sa_headers)).status_code == 200
    assert (await client.get(f"/v1/projects/{world.ids['Q']}", headers=sa_headers)).status_code == 404
    for method, url, body in (
        ("POST", base, {"name": "another"}),
        ("POST", f"/v1/projects/{world.ids['P']}/members", {"email": world.ids["OTHER_EMAIL"]}),
        ("POST", "/v1/users/me/keys", {"display_name": "x"}),
        ("POST", f"{base}/deployer/keys", {}),
    ):
        r = await client.request(method, url, headers=sa_headers, json=body)
        assert r.status_code == 403 and r.json()["error"] == SERVICE_ACCOUNT_LIMIT, url
    keys = (await client.get(f"{base}/deployer/keys", headers=admin)).json()["keys"]
    assert [k["key_id"] for k in keys] == [key["key"]["key_id"]] and keys[0]["kind"] == "service_account"
    assert (await client.delete(f"{base}/robot2/keys/{key['key']['key_id']}", headers=admin)).status_code == 404
    # Soft delete revokes every key at once; the name stays reserved.
    r = await client.delete(f"{base}/deployer", headers=admin)
    assert r.status_code == 200 and r.json()["service_account"] == sa["email"] and r.json()["deleted"] is True
    assert (await client.get(base, headers=sa_headers)).status_code == 401
    again = await client.post(base, headers=admin, json={"name": "deployer"})
    assert again.status_code == 409
    # A soft-deleted account is disabled: a new key for it is 409, since it would not authenticate.
    refused = await client.post(f"{base}/deployer/keys", headers=admin, json={})
    assert refused.status_code == 409 and "disabled" in refused.json()["error"]
    names = [s["name"] for s in (await client.get(base, headers=admin)).json()["service_accounts"]]
    assert "deployer" not in names


async def test_removing_the_grant_leaves_a_service_account_without_authority(client, world):
    admin = world.headers["project_admin"]
    base = f"/v1/projects/{world.ids['P']}"
    key = (await client.post(f"{base}/service-accounts/robot2/keys", headers=admin, json={})).json()["secret"]
    assert (await client.get(f"{base}/quota", headers=bearer(key))).status_code == 200
    r = await client.delete(f"{base}/members/service-accounts/{world.ids['SA2']}", headers=admin)
    assert r.status_code == 200
    assert (await client.get(f"{base}/quota", headers=bearer(key))).status_code == 404


async def test_workload_key(client, platform, world):
    secret = await platform.service_accounts.mint_workload_key(world.ids["P"], "agent:helper")
    assert secret.startswith("cai_wl_")
    r = await client.get(f"/v1/projects/{world.ids['P']}", headers=bearer(secret))
    assert r.status_code == 403 and r.json()["error"] == WORKLOAD_KEY_LIMIT
    me = await client.get("/v1/auth/me", headers=bearer(secret))
    assert me.status_code == 200
    assert await platform.service_accounts.revoke_workload_keys(world.ids["P"], "agent:helper") == 1
    assert (await client.get("/v1/auth/me", headers=bearer(secret))).status_code == 401


async def test_a_replacing_workload_key_revokes_the_earlier_one_of_its_label(client, platform, world):
    project = world.ids["P"]
    first = await platform.service_accounts.mint_workload_key(project, "mcp:one", replace=True)
    other = await platform.service_accounts.mint_workload_key(project, "mcp:two", replace=True)
    second = await platform.service_accounts.mint_workload_key(project, "mcp:one", replace=True)
    assert (await client.get("/v1/auth/me", headers=bearer(first))).status_code == 401
    for live in (other, second):
        assert (await client.get("/v1/auth/me", headers=bearer(live))).status_code == 200


async def test_profile_and_model_key(client, admin_headers, world, platform):
    profile = (await client.get("/v1/profile", headers=world.headers["member"])).json()
    assert set(profile) == {"model_key_configured", "secret", "namespace", "scope"}
    assert profile["model_key_configured"] is False
    assert (await client.put("/v1/profile/model-key", headers=admin_headers, json={})).status_code == 400
    r = await client.put("/v1/profile/model-key", headers=admin_headers, json={"api_key": "sk-live"})
    assert r.status_code == 200 and r.json()["model_key_configured"] is True
    assert await platform.profile.model_key() == "sk-live"
    assert (await client.get("/v1/profile", headers=world.headers["member"])).json()["model_key_configured"] is True
    assert (await client.delete("/v1/profile/model-key", headers=admin_headers)).json()["model_key_configured"] is False
    assert await platform.profile.model_key() is None


async def test_backfill(client, admin_headers):
    r = await client.post("/v1/admin/valkey-acl/backfill", headers=admin_headers)
    assert r.status_code == 200 and "default" in r.json()["backfilled"]
