"""Fixtures for the agents area: people with roles in two projects, tarballs, and a runtime whose
instances are the tiny test app (the builder and the rest of the platform are the real in-memory ones)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from caiplatform import security
from caiplatform.db.models import ApiKey, Org, OrgMember, Project, ProjectMember, User
from caiplatform.services.auth import new_short

AUTOMATION = {"Authorization": "Bearer automation-token-for-tests"}


def _now() -> datetime:
    return datetime.now(UTC)

@dataclass
class World:
    project_id: str
    project_short: str
    other_project_id: str
    admin: dict[str, str]  # org admin: project admin everywhere in the org
    member: dict[str, str]
    member2: dict[str, str]
    outsider: dict[str, str]
    automation: dict[str, str]


@pytest.fixture
def settings():
    """The shared settings minus the bootstrap admin (argon2 costs most of a second per test)."""
    from tests.settings_support import settings_for

    return settings_for(
        CAI_AUTOMATION_TOKEN="automation-token-for-tests",
        CAI_INTERNAL_TOKEN="internal-token-for-tests",
        RATELIMIT_RPS=10_000,
        RATELIMIT_BURST=10_000,
        MODEL_BASE_URL="http://127.0.0.1:9/v1",
    )


@pytest.fixture(autouse=True)
def tiny_instances(request, platform):
    """Instances run the tiny test app in-process, so the tests exercise the agents area, not a framework
    (a module with `REAL_HARNESS = True` runs the harness itself)."""
    from caiplatform.testing import tiny_app

    if not getattr(request.module, "REAL_HARNESS", False):
        platform.agents.runtime.app_factory = lambda image, env: tiny_app.create_app(env)


def _user(session, email: str, org_id: str) -> User:
    user = User(email=email, password_hash=security.dummy_password_hash(), role="user",
                must_change_password=False, org_id=org_id, created_at=_now())
    session.add(user)
    session.flush()
    return user


def _key(session, user: User) -> dict[str, str]:
    minted = security.mint_api_key()
    session.add(ApiKey(key_id=minted.key_id, secret_hash=minted.secret_hash, kind="personal", user_id=user.id,
                       created_at=_now()))
    return {"Authorization": f"Bearer {minted.secret}"}


@pytest.fixture
async def world(platform) -> World:
    def setup(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        org = session.get(Org, project.org_id)
        other = Project(org_id=org.id, slug="other", name="Other", short=new_short(session), created_at=_now(), settings={})
        session.add(other)
        session.flush()
        admin = _user(session, "boss@example.com", org.id)
        session.add(OrgMember(org_id=org.id, user_id=admin.id, role="admin", created_at=_now()))
        member = _user(session, "member@example.com", org.id)
        member2 = _user(session, "member2@example.com", org.id)
        outsider = _user(session, "outsider@example.com", org.id)
        for user in (member, member2):
            session.add(ProjectMember(project_id=project.id, user_id=user.id, role="member", created_at=_now()))
        return (project.id, project.short, other.id, _key(session, admin), _key(session, member),
                _key(session, member2), _key(session, outsider))

    pid, short, other, admin, member, member2, outsider = await platform.db.run(setup)
    return World(pid, short, other, admin, member, member2, outsider, AUTOMATION)


