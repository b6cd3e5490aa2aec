"""Users of the default project for service and HTTP tests: a member, a project admin and a user with
no grant on it. Unless a test asks for one, they have no password (argon2 is slow): tests mint their
session tokens directly."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from caiplatform.db.models import Project, ProjectMember, User
from caiplatform.principal import CredentialKind, Principal, PrincipalKind


@dataclass
class Users:
    project_id: str
    project_short: str
    member: Principal
    admin: Principal
    stranger: Principal


async def project_users(platform, prefix: str = "", *, password_hash: str = "!") -> Users:
    """A member and an admin of the default project, and a user with no grant on it; `prefix` keeps
    the e-mail addresses of several calls on one platform apart. Without a `password_hash` nobody can
    sign in with a password (`"!"` matches no hash)."""
    now = platform.clock.now()

    def run(session):
        project = session.scalar(select(Project).where(Project.slug == "default"))
        ids = {}
        for role in ("member", "admin", "stranger"):
            user = User(email=f"{prefix}{role}@users.example.com", password_hash=password_hash, role="user",
                        must_change_password=False, created_at=now)
            session.add(user)
            session.flush()
            ids[role] = user.id
            if role != "stranger":
                session.add(ProjectMember(project_id=project.id, user_id=user.id, role=role, created_at=now))
        return project.id, project.short, ids

    project_id, short, ids = await platform.db.run(run)

    def principal(role: str) -> Principal:
        return Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id=ids[role],
                         email=f"{prefix}{role}@users.example.com")

    return Users(project_id, short, principal("member"), principal("admin"), principal("stranger"))


def bearer(platform, principal: Principal) -> dict[str, str]:
    token, _ = platform.auth.tokens.issue(principal.user_id, platform.clock.time())
    return {"Authorization": f"Bearer {token}"}
