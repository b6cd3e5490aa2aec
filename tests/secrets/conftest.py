"""Fixtures for the secret store over HTTP: a project, people with roles, a workload key, an agent."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from sqlalchemy import select

from caiplatform import security
from caiplatform.db.models import ApiKey, Org, OrgMember, Project, ProjectMember, User
from caiplatform.services.auth import new_short
from caiplatform.testing.http import ADMIN_EMAIL

# Users act through personal API keys: no password hashing per test (argon2 is deliberately slow).


@dataclass
class World:
    project_id: str
    other_project_id: str
    admin: dict[str, str]
    member: dict[str, str]
    outsider: dict[str, str]
    workload: dict[str, str]
    other_workload: dict[str, str]


def _user(session, email: str, org_id: str) -> User:
    user = User(
        email=email, password_hash=security.dummy_password_hash(), role="user",
        must_change_password=False, org_id=org_id, created_at=_now(),
    )
    session.add(user)
    session.flush()
    return user


def _now():
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _personal_key(session, user: User) -> dict[str, str]:
    minted = security.mint_api_key()
    session.add(
        ApiKey(key_id=minted.key_id, secret_hash=minted.secret_hash, kind="personal", user_id=user.id,
               created_at=_now())
    )
    return {"Authorization": f"Bearer {minted.secret}"}


def _workload_key(session, project_id: str) -> str:
    minted = security.mint_workload_key()
    session.add(
        ApiKey(key_id=minted.key_id, secret_hash=minted.secret_hash, kind="workload", project_id=project_id,
               created_at=_now())
    )
    return minted.secret


@pytest.fixture
def settings():
    """The shared settings minus the bootstrap admin (its argon2 hash costs most of a second per test)."""
    from tests.settings_support import settings_for

    return settings_for(
        CAI_AUTOMATION_TOKEN="automation-token-for-tests",
        CAI_INTERNAL_TOKEN="internal-token-for-tests",
        RATELIMIT_RPS=10_000,
        RATELIMIT_BURST=10_000,
    )


@pytest.fixture
async def world(platform, client) -> World:
    def setup(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        org = session.get(Org, project.org_id)
        other = Project(org_id=org.id, slug="other", name="Other", short=new_short(session), created_at=_now(),
                        settings={})
        session.add(other)
        session.flush()
        member = _user(session, "member@example.com", org.id)
        outsider = _user(session, "outsider@example.com", org.id)
        admin = _user(session, ADMIN_EMAIL, org.id)
        admin.role = "admin"
        session.add(OrgMember(org_id=org.id, user_id=admin.id, role="admin", created_at=_now()))
        session.add(ProjectMember(project_id=project.id, user_id=member.id, role="member", created_at=_now()))
        return (
            project.id, other.id, _workload_key(session, project.id), _workload_key(session, other.id),
            _personal_key(session, member), _personal_key(session, outsider), _personal_key(session, admin),
        )

    pid, other_id, wl, other_wl, member, outsider, admin = await platform.db.run(setup)
    return World(
        project_id=pid,
        other_project_id=other_id,
        admin=admin,
        member=member,
        outsider=outsider,
        workload={"Authorization": f"Bearer {wl}"},
        other_workload={"Authorization": f"Bearer {other_wl}"},
    )


@pytest.fixture(autouse=True)
def agents(platform):
    """The recording in-memory agent-secret adapter, in place of the agents area's real one, so these
    tests see exactly what the secret store asks of agents."""
    from caiplatform.adapters.memory.agent_secrets import InMemoryAgentSecrets

    platform.secrets.set_agents(InMemoryAgentSecrets())
    return platform.secrets.agents
