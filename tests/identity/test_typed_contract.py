"""The identity routes' typed contract (issue 19): a field an operation does not know is refused with a
400 that names it and nothing is written; the spec's messages win over pydantic's; the spec's aliases
still work."""

from __future__ import annotations

from caiplatform.testing.http import login


async def test_a_misspelled_field_is_refused_by_name_and_nothing_is_written(client, admin_headers):
    r = await client.post("/v1/projects", headers=admin_headers, json={"slug": "typo-project", "nmae": "Typo"})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "nmae"'
    listed = (await client.get("/v1/projects", headers=admin_headers)).json()["projects"]
    assert "typo-project" not in [p["slug"] for p in listed]

    r = await client.post("/v1/users", headers=admin_headers, json={"email": "typo@example.com", "rol": "admin"})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "rol"'
    users = (await client.get("/v1/users", headers=admin_headers)).json()["users"]
    assert "typo@example.com" not in [u["email"] for u in users]

    r = await client.post("/v1/users/me/keys", headers=admin_headers, json={"display_name": "k", "expires_in": 3})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "expires_in"'
    assert (await client.get("/v1/users/me/keys", headers=admin_headers)).json() == {"keys": []}


async def test_the_spec_messages_win_over_pydantic(client, admin_headers):
    cases = [
        ("/v1/auth/login", {"email": "x@example.com"}, "email and password are required"),
        ("/v1/orgs", {"slug": "Bad Slug!"}, "invalid slug (must be a lowercase DNS label, at most 63 characters)"),
        ("/v1/users", {"email": "a@example.com", "role": "root"}, "role must be admin or user"),
        ("/v1/users/me/keys", {"expires_in_days": 3651},
         "expires_in_days must be 0 (never expires) or between 1 and 3650"),
    ]
    for path, body, message in cases:
        r = await client.post(path, headers=admin_headers, json=body)
        assert (r.status_code, r.json()["error"]) == (400, message), path


async def test_aliases_the_spec_accepts(client, world):
    admin = world.headers["project_admin"]
    base = f"/v1/projects/{world.ids['P']}/service-accounts"
    r = await client.post(base, headers=admin, json={"name": "alias-bot", "description": "from description"})
    assert r.status_code == 201 and r.json()["service_account"]["display_name"] == "from description"
    r = await client.post(f"{base}/alias-bot/keys", headers=admin, json={"description": "ci key"})
    assert r.status_code == 201 and r.json()["key"]["display_name"] == "ci key"
    r = await client.get(f"{base}?limit=1", headers=admin)
    assert r.status_code == 200 and len(r.json()["service_accounts"]) == 1


async def test_login_answers_the_sign_in_model(client):
    headers = await login(client)
    me = (await client.get("/v1/auth/me", headers=headers)).json()
    assert set(me) == {"email", "role", "must_change_password", "expires_at"} and isinstance(me["expires_at"], int)
