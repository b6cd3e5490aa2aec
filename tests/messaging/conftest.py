"""Fixtures for the messaging tests: the default project, its admin (the bootstrap admin) and a member."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cache

import pytest
from sqlalchemy import select

from caiplatform import security
from caiplatform.db.models import Project, ProjectMember, User

_real_hash_password = security.hash_password


@cache
def _hash_once(password: str) -> str:
    return _real_hash_password(password)


@pytest.fixture(autouse=True)
def _bootstrap_hashes_once(monkeypatch):
    """Every test's platform bootstraps the same admin: argon2 (slow on purpose) runs once per session."""
    monkeypatch.setattr(security, "hash_password", _hash_once)


@dataclass
class Api:
    client: object
    pid: str
    short: str
    admin: dict[str, str]
    member: dict[str, str]
    stranger: dict[str, str]

    @property
    def topics(self) -> str:
        return f"/v1/projects/{self.pid}/topics"

    def topic(self, name: str) -> str:
        return f"{self.topics}/{name}"

    def subs(self, topic: str) -> str:
        return f"{self.topics}/{topic}/subscriptions"

    def sub(self, topic: str, name: str) -> str:
        return f"{self.subs(topic)}/{name}"


def bearer(platform, user_id: str) -> dict[str, str]:
    """A session token minted directly: signing in is proven elsewhere, and argon2 is slow on purpose."""
    token, _ = platform.auth.tokens.issue(user_id, platform.clock.time())
    return {"Authorization": f"Bearer {token}"}


async def make_api(platform, client) -> Api:
    now = platform.clock.now()
    tag = secrets.token_hex(3)
    emails = {role: f"{role}-{tag}@example.com" for role in ("member", "stranger")}

    def run(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        admin = session.scalar(select(User).where(User.role == "admin"))
        ids = {"admin": admin.id}
        for role, email in emails.items():
            user = User(email=email, password_hash="!unusable", role="user", must_change_password=False,
                        created_at=now)
            session.add(user)
            session.flush()
            ids[role] = user.id
            if role == "member":
                session.add(ProjectMember(project_id=project.id, user_id=user.id, role="member", created_at=now))
        return project.id, project.short, ids

    pid, short, ids = await platform.db.run(run)
    return Api(client, pid, short, *(bearer(platform, ids[r]) for r in ("admin", "member", "stranger")))


@pytest.fixture
async def api(platform, client) -> Api:
    return await make_api(platform, client)


@pytest.fixture
def api_for():
    """`await api_for(platform, client)`: the same handles for a platform the test builds itself."""
    return make_api
