"""Users of the default project for service and HTTP tests: a member, a project admin and a user with
no grant on it. Unless a test asks for one, they have no password (argon2 is slow): tests mint their
session tokens directly. Also the bootstrap admin as a principal, and projects it creates and deletes."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from caiplatform.db.models import Project, ProjectMember, User
from caiplatform.models.projects import ProjectCreate, ProjectDeleted
from caiplatform.principal import CredentialKind, Principal, PrincipalKind
from caiplatform.services.access import ProjectRef


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


async def bootstrap_admin(platform) -> Principal:
    """The bootstrap admin (platform admin, admin of the default org, so of every project created in it)
    as a signed-in person, without a password check."""
    user_id, email = await platform.db.run(lambda s: tuple(s.execute(
        select(User.id, User.email).where(User.role == "admin").order_by(User.created_at)).first()))
    return Principal(PrincipalKind.USER, CredentialKind.SESSION, user_id=user_id, email=email)


async def new_project(platform, slug: str) -> ProjectRef:
    """A project of the default org, created by the bootstrap admin."""
    created = await platform.projects.create(await bootstrap_admin(platform), ProjectCreate(slug=slug))
    view = created.project
    return ProjectRef(view.id, view.org_id, view.slug, view.name, view.short)


async def delete_project(platform, project_id: str) -> ProjectDeleted:
    """Delete a project as the bootstrap admin (a person: the automation token may not): its `ProjectDeleted`."""
    return await platform.projects.delete(await bootstrap_admin(platform), project_id)
