"""Helpers for identity tests: sign-in, accounts and projects created over HTTP."""

from __future__ import annotations

import uuid

import pytest

from caiplatform.testing.http import login

PASSWORD = "a long enough password"


class World:
    """Creates principals of every kind against one platform through its HTTP API."""

    def __init__(self, client, platform, admin_headers):
        self.client = client
        self.platform = platform
        self.admin = admin_headers

    async def user(self, *, role: str = "user", change_password: bool = True) -> tuple[dict[str, str], str, str]:
        """A fresh account (headers, email, user id); by default it has changed its first password."""
        email = f"u{uuid.uuid4().hex[:8]}@example.com"
        r = await self.client.post("/v1/users", headers=self.admin, json={"email": email, "role": role, "password": PASSWORD})
        assert r.status_code == 201, r.text
        user_id = r.json()["user"]["id"]
        headers = await login(self.client, email, PASSWORD)
        if change_password:
            r = await self.client.post(
                "/v1/auth/change-password", headers=headers, json={"current_password": PASSWORD, "new_password": PASSWORD + "!"}
            )
            assert r.status_code == 200, r.text
            headers = {"Authorization": f"Bearer {r.json()['token']}"}
        return headers, email, user_id

    async def project(self, headers: dict[str, str] | None = None, **body) -> dict:
        slug = body.pop("slug", f"p-{uuid.uuid4().hex[:8]}")
        r = await self.client.post("/v1/projects", headers=headers or self.admin, json={"slug": slug, "name": slug.upper(), **body})
        assert r.status_code == 201, r.text
        return r.json()["project"]

    async def member(self, project_id: str, email: str, role: str = "member") -> None:
        r = await self.client.post(f"/v1/projects/{project_id}/members", headers=self.admin, json={"email": email, "role": role})
        assert r.status_code == 201, r.text


@pytest.fixture
async def world(client, platform, admin_headers):
    return World(client, platform, admin_headers)


@pytest.fixture(autouse=True)
def cheap_password_hashing(monkeypatch):
    """argon2id with minimal cost: these tests hash hundreds of passwords and check rules, not the hasher."""
    from argon2 import PasswordHasher

    from caiplatform import security

    monkeypatch.setattr(security, "_hasher", PasswordHasher(time_cost=1, memory_cost=64, parallelism=1))
