"""Fixtures for the messaging tests: the default project, its admin (the bootstrap admin) and a member."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cache

import pytest
from sqlalchemy import select

from caiplatform import security
from caiplatform.db.models import Project, ProjectMember, User

PASSWORD = "messaging test password"


@cache
def password_hash() -> str:
    return security.hash_password(PASSWORD)  # argon2 is slow on purpose: hash once per run


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


async def make_api(platform, client, admin_headers) -> Api:
    from caiplatform.testing.http import login

    now = platform.clock.now()
    tag = secrets.token_hex(3)
    emails = {role: f"{role}-{tag}@example.com" for role in ("member", "stranger")}

    def run(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        for role, email in emails.items():
            user = User(email=email, password_hash=password_hash(), role="user", must_change_password=False,
                        created_at=now)
            session.add(user)
            session.flush()
            if role == "member":
                session.add(ProjectMember(project_id=project.id, user_id=user.id, role="member", created_at=now))
        return project.id, project.short

    pid, short = await platform.db.run(run)
    member = await login(client, emails["member"], PASSWORD)
    stranger = await login(client, emails["stranger"], PASSWORD)
    return Api(client, pid, short, admin_headers, member, stranger)


@pytest.fixture
async def api(platform, client, admin_headers) -> Api:
    return await make_api(platform, client, admin_headers)
