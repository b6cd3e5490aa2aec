"""Authorization: the one place that answers "why was this denied".

Authority has two axes (document 2):
- metadata: authority over the project object (rename, delete, membership);
- resource: authority over its contents (agents, secrets, topics, indexes, ...).

How a caller gets a role on a project, resolved live on every request:

| caller                         | metadata role      | resource role      |
|--------------------------------|--------------------|--------------------|
| platform admin (no grant)      | admin              | none               |
| org admin of the project's org | admin              | admin              |
| direct member grant            | that role          | that role          |
| active break-glass grant       | that role          | that role          |
| service-account key            | none               | its grant's role   |
| automation token, internal     | admin              | admin              |
| workload key                   | none               | none (it may only mint read tokens, in services/secrets) |

The 404 rule: no role on either axis → 404, identical to a missing project. Some role, but not the one
the action needs → 403.

Gates that are not about one project (`OrgAuthority`):

| action                     | who                                                                       |
|----------------------------|---------------------------------------------------------------------------|
| users, orgs, model key     | platform admin (or the automation token); never a service-account key     |
| create an account          | platform admin anywhere; org admin in their orgs; project admin in their home org; only a platform admin creates a platform admin |
| create a project           | platform admin anywhere; org admin in their orgs                          |
| break-glass                | a platform admin, with a person's credential, holding no resource grant on the project |

Before any of these: no credential → 401; a workload key → 403 (`WORKLOAD_KEY_LIMIT`); a user who owes
a password change → 403 (`PASSWORD_CHANGE_REQUIRED`); credentials, accounts and membership are never
managed by a service-account key → 403 (`SERVICE_ACCOUNT_LIMIT`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, exists, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import BindParameter

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.db.models import OrgMember, Project, ProjectMember, ServiceAccount, User
from caiplatform.db.prepared import PreparedRead
from caiplatform.domain.projects import ProjectRef as ProjectRef  # re-exported: services import it from here
from caiplatform.errors import BadRequest, Forbidden, NotFound, PlatformError, Unauthenticated
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.validation import project_uuid

AUTH_REQUIRED = "this route requires authentication; sign in or use the automation token"
PASSWORD_CHANGE_REQUIRED = "password change required before using this API"
WORKLOAD_KEY_LIMIT = "a workload key can only mint a read token for its own project's secrets"
SERVICE_ACCOUNT_LIMIT = "a service account cannot create or manage credentials, accounts or membership"
PROJECT_ADMIN_REQUIRED = "this action requires the project admin role"
PLATFORM_ADMIN_REQUIRED = "this action requires the platform admin role"


class Axis(StrEnum):
    METADATA = "metadata"
    RESOURCE = "resource"


class Role(StrEnum):
    MEMBER = "member"
    ADMIN = "admin"


_RANK = {None: 0, "member": 1, "admin": 2}


@dataclass(frozen=True)
class ProjectGrant:
    """What a principal holds on one project."""

    project: ProjectRef
    metadata_role: str | None
    resource_role: str | None

    @property
    def visible(self) -> bool:
        return self.metadata_role is not None or self.resource_role is not None

    def role(self, axis: Axis) -> str | None:
        return self.metadata_role if axis is Axis.METADATA else self.resource_role


@dataclass(frozen=True)
class OrgAuthority:
    """What a caller may do at the organization level, resolved live."""

    platform: bool  # platform admin or automation token
    home_org: str | None
    org_admin: frozenset[str]  # orgs the caller administers
    project_admin: bool  # holds a real (not break-glass) admin grant on some project

    def may_create_accounts(self) -> bool:
        return self.platform or bool(self.org_admin) or self.project_admin

    def may_create_account_in(self, org_id: str | None) -> bool:
        return self.platform or org_id in self.org_admin or (self.project_admin and org_id == self.home_org)

    def may_create_project_in(self, org_id: str) -> bool:
        return self.platform or org_id in self.org_admin


def user_grant(ref: ProjectRef, platform_admin: bool, org_admin: bool,
               members: Iterable[tuple[str, bool, datetime | None]], now: datetime) -> ProjectGrant:
    """What a user holds on a project, from what the database says about them: the platform admin role,
    the admin role in the project's org, and their grants on the project (role, break-glass, expiry).
    The one statement of these rules, whichever way the facts were read."""
    if org_admin:
        return ProjectGrant(ref, "admin", "admin")
    metadata: str | None = "admin" if platform_admin else None
    resource: str | None = None
    for role, break_glass, expires_at in members:
        if break_glass and (expires_at is None or expires_at <= now):
            continue
        if _RANK[role] > _RANK[resource]:
            resource = role
        if _RANK[role] > _RANK[metadata]:
            metadata = role
    return ProjectGrant(ref, metadata, resource)


def _checked(grant: ProjectGrant, need: Role | None, axis: Axis, admin_message: str) -> ProjectGrant:
    """`grant` when it shows the project and holds `need` on `axis`; else the refusal the project gate gives."""
    if not grant.visible:
        raise NotFound("not found")
    if need is not None and _RANK[grant.role(axis)] < _RANK[need.value]:
        if need is Role.ADMIN:
            raise Forbidden(admin_message)
        raise Forbidden(f"this action requires a {axis.value} role on the project")
    return grant


# The caller's grant on a project, as columns of one statement (`Access.project_gate_sync`): the project's
# fields, the user's platform role, whether they are an admin of the project's org, and their grants on
# the project (one row each, through an outer join). A statement selects `GATE_COLUMNS`, starts
# `.select_from(Project).outerjoin(ProjectMember, GATE_MEMBER_JOIN)`, joins what else it reads and filters
# on `Project.id == bindparam("project")`; `grant_user` is bound by the gate.
_GATE_PROJECT_FIELDS = ("id", "org_id", "slug", "name", "short")
_GATE_USER: BindParameter[str] = bindparam("grant_user")
GATE_COLUMNS: tuple[ColumnElement[Any], ...] = (
    *(getattr(Project, f).label(f"gate_project_{f}") for f in _GATE_PROJECT_FIELDS),
    select(User.role).where(User.id == _GATE_USER).scalar_subquery().label("grant_user_role"),
    exists().where(OrgMember.org_id == Project.org_id, OrgMember.user_id == _GATE_USER,
                   OrgMember.role == "admin").label("grant_org_admin"),
    ProjectMember.role.label("grant_member_role"),
    ProjectMember.break_glass.label("grant_member_break_glass"),
    ProjectMember.expires_at.label("grant_member_expires_at"),
)
GATE_MEMBER_JOIN = and_(ProjectMember.project_id == Project.id, ProjectMember.user_id == _GATE_USER)


def gate_project(row: Any) -> ProjectRef:
    """The project of a row that selects `GATE_COLUMNS`."""
    return ProjectRef(*(getattr(row, f"gate_project_{f}") for f in _GATE_PROJECT_FIELDS))


# The project gate alone: the caller's grant on the project (`Access.project`).
_PROJECT_GATE = PreparedRead(
    select(*GATE_COLUMNS).select_from(Project).outerjoin(ProjectMember, GATE_MEMBER_JOIN)
    .where(Project.id == bindparam("project"))
)


def _grant_unread(principal: Principal, ref: ProjectRef) -> ProjectGrant | None:
    """The grant that needs no read: the automation token and the platform itself hold every role; a service
    account outside its project, a workload key and a caller who is no one hold none. None: a read decides
    (a person; a service account in its own project)."""
    kind = principal.kind
    if kind in (PrincipalKind.AUTOMATION, PrincipalKind.INTERNAL):
        return ProjectGrant(ref, "admin", "admin")
    if kind is PrincipalKind.SERVICE_ACCOUNT and principal.project_id == ref.id:
        return None
    if kind is PrincipalKind.USER and principal.user_id:
        return None
    return ProjectGrant(ref, None, None)


def _service_account_grant_sync(session: Session, principal: Principal, ref: ProjectRef) -> ProjectGrant:
    """A service account's grant on its own project: its grant's role, while the account is enabled and not
    deleted (resource axis only)."""
    row = session.scalar(
        select(ProjectMember).where(
            ProjectMember.project_id == ref.id,
            ProjectMember.service_account_id == principal.service_account_id,
        )
    )
    sa = session.get(ServiceAccount, principal.service_account_id)
    if row is None or sa is None or sa.disabled or sa.deleted_at is not None:
        return ProjectGrant(ref, None, None)
    return ProjectGrant(ref, None, row.role)


def gate_user_grant(ref: ProjectRef, rows: Sequence[Any], now: datetime) -> ProjectGrant:
    """A person's grant on `ref` from the `GATE_COLUMNS` of its rows (one per grant row, at least one)."""
    members = [(row.grant_member_role, bool(row.grant_member_break_glass), row.grant_member_expires_at)
               for row in rows if row.grant_member_role is not None]
    return user_grant(ref, rows[0].grant_user_role == "admin", bool(rows[0].grant_org_admin), members, now)


class Access:
    def __init__(self, db: Database, clock: Clock):
        self.db = db
        self.clock = clock

    # -- gates that do not depend on a project -------------------------------------------------

    def require_authenticated(self, principal: Principal) -> None:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)

    def require_management(self, principal: Principal, *, allow_workload: bool = False) -> None:
        """Every management route: a credential, no owed password change, no workload key."""
        self.require_authenticated(principal)
        if principal.kind is PrincipalKind.WORKLOAD and not allow_workload:
            raise Forbidden(WORKLOAD_KEY_LIMIT)
        # Read from the account when the credential was resolved (`AuthService.authenticate`, anew on every
        # request): no second read of the same row, and nothing on the event loop.
        if principal.kind is PrincipalKind.USER and principal.must_change_password:
            raise Forbidden(PASSWORD_CHANGE_REQUIRED)

    def require_human(self, principal: Principal) -> None:
        """Credentials, accounts and membership are managed by people only."""
        self.require_management(principal)
        if principal.kind is PrincipalKind.SERVICE_ACCOUNT:
            raise Forbidden(SERVICE_ACCOUNT_LIMIT)

    def platform_authority_sync(self, session: Session, principal: Principal) -> bool:
        """Platform-wide account authority: a platform admin, or the automation token (the cluster's own
        machine credential, which acts for the platform operator)."""
        return principal.kind is PrincipalKind.AUTOMATION or self.is_platform_admin(session, principal)

    async def require_platform_admin(self, principal: Principal) -> None:
        """Users, organizations, the platform model key: human (or automation) credentials with the
        platform admin role. A service-account key is refused before its role is even considered.
        The role is read live (a demotion counts at once), in a worker thread."""
        self.require_human(principal)
        if principal.kind is PrincipalKind.AUTOMATION:
            return
        if not await self.db.run(lambda s: self.platform_authority_sync(s, principal)):
            raise Forbidden(PLATFORM_ADMIN_REQUIRED)

    def is_platform_admin(self, session: Session, principal: Principal) -> bool:
        if principal.kind is not PrincipalKind.USER or not principal.user_id:
            return False
        user = session.get(User, principal.user_id)
        return user is not None and user.role == "admin"

    def org_authority_sync(self, session: Session, principal: Principal) -> OrgAuthority:
        home: str | None = None
        project_admin = False
        if principal.kind is PrincipalKind.USER and principal.user_id:
            user = session.get(User, principal.user_id)
            home = user.org_id if user else None
            project_admin = (
                session.scalar(
                    select(ProjectMember.id).where(
                        ProjectMember.user_id == principal.user_id,
                        ProjectMember.role == "admin",
                        ProjectMember.break_glass.is_(False),
                    ).limit(1)
                )
                is not None
            )
        return OrgAuthority(
            self.platform_authority_sync(session, principal),
            home,
            frozenset(self.org_admin_of(session, principal)),
            project_admin,
        )

    def org_admin_of(self, session: Session, principal: Principal) -> set[str]:
        if principal.kind is not PrincipalKind.USER or not principal.user_id:
            return set()
        rows = session.scalars(
            select(OrgMember.org_id).where(OrgMember.user_id == principal.user_id, OrgMember.role == "admin")
        )
        return set(rows)

    # -- project grants -------------------------------------------------------------------------

    def grant_sync(self, session: Session, principal: Principal, project: Project) -> ProjectGrant:
        return self.grant_of_sync(session, principal, ProjectRef.of(project))

    def grant_of_sync(self, session: Session, principal: Principal, ref: ProjectRef) -> ProjectGrant:
        """The caller's grant on `ref`, read through the ORM (the lists of projects; one project's gate reads
        it with the request's own statement: `gate_grant_sync`)."""
        known = _grant_unread(principal, ref)
        if known is not None:
            return known
        if principal.kind is PrincipalKind.SERVICE_ACCOUNT:
            return _service_account_grant_sync(session, principal, ref)
        platform_admin = self.is_platform_admin(session, principal)
        if ref.org_id in self.org_admin_of(session, principal):
            return user_grant(ref, platform_admin, True, (), self.clock.now())
        rows = session.execute(
            select(ProjectMember.role, ProjectMember.break_glass, ProjectMember.expires_at).where(
                ProjectMember.project_id == ref.id, ProjectMember.user_id == principal.user_id
            )
        ).all()
        return user_grant(ref, platform_admin, False, rows, self.clock.now())

    def gate_grant_sync(self, connection: Connection, principal: Principal, ref: ProjectRef, rows: Sequence[Any],
                        now: datetime | None = None) -> ProjectGrant:
        """The caller's grant on `ref` from the rows of a statement that selects `GATE_COLUMNS` (one per grant
        row of the user, at least one): a person's from the rows themselves, a service account's read as
        `grant_of_sync` reads it (an ORM session on `connection`), the other callers' without a read."""
        known = _grant_unread(principal, ref)
        if known is not None:
            return known
        if principal.kind is PrincipalKind.USER:
            return gate_user_grant(ref, rows, now or self.clock.now())
        with Session(bind=connection) as session:
            return _service_account_grant_sync(session, principal, ref)

    def project_gate_sync(
        self,
        connection: Connection,
        principal: Principal,
        project_id: str,
        statement: PreparedRead | None = None,
        params: dict[str, object] | None = None,
        *,
        need: Role | None = Role.MEMBER,
        axis: Axis = Axis.RESOURCE,
        bad_id: type[PlatformError] = BadRequest,
        admin_message: str = PROJECT_ADMIN_REQUIRED,
    ) -> tuple[ProjectGrant, list[Any]]:
        """The project gate: the project by id for `principal`, checked for `need` on `axis` (None: just
        visible), in one prepared statement with the request's own read (`statement`, see `GATE_COLUMNS`;
        None: the gate alone). The grant and the statement's rows (one per grant row of the user, at least
        one). A malformed id is `bad_id`; no such project, or one the caller does not see, 404."""
        pid = project_uuid(project_id, bad_id)
        user_id = principal.user_id if principal.kind is PrincipalKind.USER else None
        rows = (statement or _PROJECT_GATE).all(connection, {**(params or {}), "project": pid, "grant_user": user_id})
        if not rows:
            raise NotFound("not found")
        grant = self.gate_grant_sync(connection, principal, gate_project(rows[0]), rows)
        return _checked(grant, need, axis, admin_message), rows

    async def project(
        self,
        principal: Principal,
        project_id: str,
        *,
        need: Role | None = Role.MEMBER,
        axis: Axis = Axis.RESOURCE,
        bad_id: type[PlatformError] = BadRequest,
    ) -> ProjectGrant:
        """The check every project-scoped route makes first (after `require_management`): `project_gate_sync`
        on the database's read path, without a transaction to commit (on a session's connection: the
        service's unit of work, so a database that cannot be reached fails here as it would there)."""
        def read(session: Session) -> ProjectGrant:
            return self.project_gate_sync(session.connection(), principal, project_id, need=need, axis=axis,
                                          bad_id=bad_id)[0]

        return await self.db.read_session(read)

    async def project_grant(self, principal: Principal, project_id: str, need: Role | None = Role.MEMBER, *,
                            human: bool = False, **where: Any) -> ProjectGrant:
        """The project gate of every project-scoped service: a credential that may manage resources
        (`require_management`, or `require_human` for what only people do: 401, 403), then the project by
        id, visible to the caller (else 404) with `need` on `axis` (else 403). A malformed id is `bad_id`
        (the documents differ: 400 in some areas, 404 in others). `where`: `project`'s `axis` and `bad_id`."""
        if human:
            self.require_human(principal)
        else:
            self.require_management(principal)
        return await self.project(principal, project_id, need=need, **where)

    async def project_ref(self, principal: Principal, project_id: str, need: Role | None = Role.MEMBER, *,
                          bad_id: type[PlatformError] = BadRequest) -> ProjectRef:
        """`project_grant`'s project, for a service that needs no more of the grant."""
        return (await self.project_grant(principal, project_id, need, bad_id=bad_id)).project

    def project_by_ref_sync(self, session: Session, ref: str) -> list[Project]:
        """Projects matching a `?project=` value: slug, short or id."""
        return list(session.scalars(select(Project).where(or_(Project.slug == ref, Project.short == ref, Project.id == ref))))

    def visible_projects_sync(self, session: Session, principal: Principal) -> list[ProjectGrant]:
        grants = [self.grant_sync(session, principal, p) for p in session.scalars(select(Project).order_by(Project.slug))]
        return [g for g in grants if g.visible]
