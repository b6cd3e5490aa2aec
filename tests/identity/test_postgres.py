"""Identity over HTTP on a PostgreSQL-backed platform (migrations, cascades, one-time secrets, restart)."""

from __future__ import annotations

import pytest

from caiplatform.platform import Platform
from caiplatform.testing import engines
from caiplatform.testing.http import asgi_client, login


@pytest.fixture
def pg_settings(settings, postgres_url, tmp_path):
    with engines.fresh_postgres_database() as url:
        yield settings.model_copy(update={"database_url": url, "data_dir": tmp_path})


async def test_tenancy_flow_on_postgres(pg_settings, clock):
    platform = Platform.from_settings(pg_settings, clock=clock)
    try:
        async with asgi_client(platform) as client:
            admin = await login(client)
            r = await client.post("/v1/projects", headers=admin, json={"slug": "pg-team", "name": "PG"})
            assert r.status_code == 201 and "warning" not in r.json()
            project = r.json()["project"]
            # The local provisioner recorded its steps under the data dir.
            assert (pg_settings.data_dir / "projects" / project["short"] / "provisioning.json").exists()
            base = f"/v1/projects/{project['id']}"
            user = await client.post("/v1/users", headers=admin, json={"email": "dev@example.com", "password": "dev password 1234"})
            assert user.status_code == 201
            assert (await client.post(f"{base}/members", headers=admin, json={"email": "dev@example.com", "role": "admin"})).status_code == 201
            sa = await client.post(f"{base}/service-accounts", headers=admin, json={"name": "ci"})
            assert sa.status_code == 201
            key = (await client.post(f"{base}/service-accounts/ci/keys", headers=admin, json={"expires_in_days": 30})).json()
            sa_headers = {"Authorization": f"Bearer {key['secret']}"}
            assert (await client.get(f"{base}/service-accounts", headers=sa_headers)).status_code == 200
            invite = (await client.post(f"{base}/invitations", headers=admin, json={"email": "guest@example.com"})).json()
            accepted = await client.post(
                "/v1/invitations/accept", json={"token": invite["invitation"]["token"], "password": "guest password 12"}
            )
            assert accepted.status_code == 200
            actions = [e["action"] for e in (await client.get(f"{base}/audit", headers=admin)).json()["entries"]]
            assert actions == [
                "invitation.accept", "project.invite", "serviceaccount.key.create", "serviceaccount.create",
                "project.member.add", "project.create",
            ]
    finally:
        await platform.aclose()

    # A restart on the same database keeps everything, and the service-account key still works.
    platform = Platform.from_settings(pg_settings, clock=clock)
    try:
        async with asgi_client(platform) as client:
            assert (await client.get(f"{base}/service-accounts", headers=sa_headers)).status_code == 200
            admin = await login(client)
            r = await client.delete(base, headers=admin)
            assert r.status_code == 200 and r.json() == {"deleted": True, "project": "pg-team"}
            assert (await client.get(f"{base}/service-accounts", headers=sa_headers)).status_code == 401
            assert (await client.delete("/v1/users/dev@example.com", headers=admin)).status_code == 200
            users = [u["email"] for u in (await client.get("/v1/users", headers=admin)).json()["users"]]
            assert users == ["admin@example.com", "guest@example.com"]
    finally:
        await platform.aclose()


async def test_guards_and_break_glass_expiry_on_postgres(pg_settings, clock):
    from .world import build_world

    platform = Platform.from_settings(pg_settings, clock=clock)
    try:
        world = build_world(platform, pg_settings.automation_token)
        async with asgi_client(platform) as client:
            base = f"/v1/projects/{world.ids['P']}"
            members = (await client.get(f"{base}/members", headers=world.headers["member"])).json()["members"]
            padmin = next(m for m in members if m["role"] == "admin" and m["kind"] == "user" and not m.get("break_glass"))
            r = await client.delete(f"{base}/members/{padmin['user_id']}", headers=world.headers["org_admin"])
            assert r.status_code == 409
            admin = world.headers["platform_admin"]
            r = await client.post(f"{base}/break-glass", headers=admin, json={"reason": "database repair", "minutes": 5})
            assert r.status_code == 201
            assert (await client.get(f"{base}/quota", headers=admin)).status_code == 200
            clock.advance(minutes=6)
            assert (await client.get(f"{base}/quota", headers=admin)).status_code == 403
            rows = (await client.get(f"{base}/members", headers=admin)).json()["members"]
            assert any(m.get("expired") for m in rows if m["email"].startswith("platadmin-"))
    finally:
        await platform.aclose()
