"""Fixtures for the vector index tests: the default project, a member, an admin and a stranger."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import pytest
from sqlalchemy import select

from caiplatform.db.models import Project, ProjectMember, User
from caiplatform.testing.http import asgi_client


@dataclass
class Project3:
    """The default project and bearer headers for a member, a project admin and a user with no grant."""

    id: str
    short: str
    member: dict[str, str]
    admin: dict[str, str]
    stranger: dict[str, str]


async def project_with_users(platform) -> Project3:
    now = platform.clock.now()
    tag = secrets.token_hex(3)

    def run(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        ids = {}
        for role in ("member", "admin", "stranger"):
            # No password: these users get their session token minted directly (argon2 is slow).
            user = User(email=f"{role}-{tag}@example.com", password_hash="!", role="user",
                        must_change_password=False, created_at=now)
            session.add(user)
            session.flush()
            ids[role] = user.id
            if role != "stranger":
                session.add(ProjectMember(project_id=project.id, user_id=user.id, role=role, created_at=now))
        return project.id, project.short, ids

    project_id, short, ids = await platform.db.run(run)

    def bearer(user_id: str) -> dict[str, str]:
        token, _ = platform.auth.tokens.issue(user_id, platform.clock.time())
        return {"Authorization": f"Bearer {token}"}

    return Project3(project_id, short, bearer(ids["member"]), bearer(ids["admin"]), bearer(ids["stranger"]))


@pytest.fixture
async def project(platform) -> Project3:
    return await project_with_users(platform)


@pytest.fixture
async def http(platform):
    async with asgi_client(platform, ["vectordb"]) as c:
        yield c


@pytest.fixture
def project_of():
    """`await project_of(platform)` for tests that build their own platform."""
    return project_with_users
