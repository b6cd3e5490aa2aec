"""Sign-in, the signed-in principal, password change, throttling and token expiry."""

from __future__ import annotations

from caiplatform.platform import Platform
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD, asgi_client, login


async def test_login_and_me(client):
    response = await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"token", "email", "role", "must_change_password", "expires_at"}
    assert body["role"] == "admin" and body["must_change_password"] is False
    me = await client.get("/v1/auth/me", headers={"Authorization": f"Bearer {body['token']}"})
    assert me.status_code == 200
    assert me.json() == {
        "email": ADMIN_EMAIL,
        "role": "admin",
        "must_change_password": False,
        "expires_at": body["expires_at"],
    }


async def test_wrong_password_and_unknown_user_get_the_same_answer(client):
    wrong = await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": "not the password"})
    unknown = await client.post("/v1/auth/login", json={"email": "nobody@example.com", "password": "whatever12345"})
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json()["error"] == unknown.json()["error"] == "invalid email or password"


async def test_missing_fields_are_400(client):
    response = await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL})
    assert response.status_code == 400


async def test_session_token_expires_after_12_hours(client, clock):
    headers = await login(client)
    clock.advance(hours=11, minutes=59)
    assert (await client.get("/v1/auth/me", headers=headers)).status_code == 200
    clock.advance(minutes=2)
    assert (await client.get("/v1/auth/me", headers=headers)).status_code == 401


async def test_sign_in_throttle_per_ip(client, clock):
    for _ in range(10):
        assert (await client.post("/v1/auth/login", json={"email": "x@example.com", "password": "wrong-password"})).status_code == 401
    limited = await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
    assert limited.status_code == 429
    assert limited.json()["error"].startswith("too many sign-in attempts; try again in ")
    assert int(limited.headers["retry-after"]) > 0
    clock.advance(minutes=15, seconds=1)
    assert (await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})).status_code == 200


async def test_change_password(client):
    headers = await login(client)
    new = "a brand new password"
    bad = await client.post("/v1/auth/change-password", headers=headers, json={"current_password": "nope", "new_password": new})
    assert bad.status_code == 401 and bad.json()["error"] == "current password is incorrect"
    short = await client.post(
        "/v1/auth/change-password", headers=headers, json={"current_password": ADMIN_PASSWORD, "new_password": "short"}
    )
    assert short.status_code == 400 and short.json()["error"] == "password must be at least 12 characters"
    same = await client.post(
        "/v1/auth/change-password", headers=headers, json={"current_password": ADMIN_PASSWORD, "new_password": ADMIN_PASSWORD}
    )
    assert same.status_code == 400 and same.json()["error"] == "new password must differ from the current one"
    ok = await client.post("/v1/auth/change-password", headers=headers, json={"current_password": ADMIN_PASSWORD, "new_password": new})
    assert ok.status_code == 200 and ok.json()["token"]
    assert (await client.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": new})).status_code == 200


async def test_no_accounts_means_user_management_not_initialized(settings, clock):
    bare = settings.model_copy(update={"admin_email": None, "admin_password": None})
    async with asgi_client(Platform.in_memory(bare, clock=clock)) as c:
        response = await c.post("/v1/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD})
        assert response.status_code == 503


async def test_automation_token_is_a_principal(client, settings):
    automation = {"Authorization": f"Bearer {settings.automation_token}"}
    response = await client.get("/v1/auth/me", headers=automation)
    assert response.status_code == 200
    assert response.json() == {"email": "", "role": "admin", "must_change_password": False, "expires_at": None}
    assert (await client.get("/v1/users", headers=automation)).status_code == 200  # a platform-admin route
    near_miss = {"Authorization": f"Bearer {settings.automation_token}x"}
    assert (await client.get("/v1/auth/me", headers=near_miss)).status_code == 401
    assert (await client.get("/v1/users", headers=near_miss)).status_code == 401
