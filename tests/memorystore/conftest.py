"""Fixtures for the memory store tests: the default project and three users with different standing."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from functools import cache

import pytest
from sqlalchemy import select

from caiplatform import security
from caiplatform.db.models import Project, ProjectMember, User
from caiplatform.principal import CredentialKind, Principal, PrincipalKind

PASSWORD = "memorystore test password"


@cache
def password_hash() -> str:
    return security.hash_password(PASSWORD)  # argon2 is slow on purpose: hash once per run


@dataclass
class Users:
    project_id: str
    project_short: str
    member: Principal
    admin: Principal
    stranger: Principal
    emails: dict[str, str]
    password: str = PASSWORD


async def project_users(platform) -> Users:
    """A member and an admin of the default project, and a signed-up user with no grant on it."""
    now = platform.clock.now()
    tag = secrets.token_hex(3)
    emails = {role: f"{role}-{tag}@example.com" for role in ("member", "admin", "stranger")}

    def run(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        ids = {}
        for role, email in emails.items():
            user = User(email=email, password_hash=password_hash(), role="user",
                        must_change_password=False, created_at=now)
            session.add(user)
            session.flush()
            ids[role] = user.id
            if role != "stranger":
                session.add(ProjectMember(project_id=project.id, user_id=user.id, role=role, created_at=now))
        return project.id, project.short, ids

    project_id, short, ids = await platform.db.run(run)

    def principal(role: str) -> Principal:
        return Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id=ids[role], email=emails[role])

    return Users(project_id, short, principal("member"), principal("admin"), principal("stranger"), emails)


@pytest.fixture
async def users(platform) -> Users:
    return await project_users(platform)


@pytest.fixture
def users_of():
    """`await users_of(platform)` for tests that build their own platform."""
    return project_users
