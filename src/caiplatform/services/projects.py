"""Projects and what hangs off them (document 2): the project object, members, service-account grants,
break-glass, invitations, the cloud-credential mapping, quota and the audit log.

Authority follows `services/access.py`: membership, invitations, rename and delete need *metadata*
admin (a platform admin has it everywhere); anything inside the project needs *resource* authority,
which a platform admin only gets through a break-glass grant.
"""

from __future__ import annotations

import builtins
import logging
import secrets as token_source
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from caiplatform import security, validation
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import AuditEntry, Invitation, Org, Project, ProjectMember, ServiceAccount, User
from caiplatform.domain.identity import (
    DEFAULT_QUOTA,
    FALLBACK_QUOTA,
    PLATFORM_CLOUD_KEY,
    QUOTA_KEY,
    QUOTA_LABELS,
    default_cloud_mapping,
)
from caiplatform.errors import BadRequest, Conflict, Forbidden, Gone, NotFound
from caiplatform.models import projects as api
from caiplatform.models.accounts import BODY_ORG_ID_MESSAGE
from caiplatform.pagination import Page, Pager
from caiplatform.ports.projects import ProjectProvisioner, ProjectSpec
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.quantity import format_quantity, parse_quantity
from caiplatform.services.access import Access, Axis, ProjectGrant, Role
from caiplatform.services.accounts import AgentHooks
from caiplatform.services.audit import AuditLog
from caiplatform.services.auth import DEFAULT_SLUG, new_short

log = logging.getLogger(__name__)

LAST_ADMIN_MESSAGE = "this is the project's only admin - promote someone else first"
INVITATION_DAYS = 7
RESERVED_SLUG_MESSAGE = "the slug default is reserved for the default project"

UsageFn = Callable[[str], Awaitable[dict[str, int]]]


class SignInGuard(Protocol):
    """The sign-in throttle (`AuthService`): invitation accept is limited like login."""

    async def throttle_sign_in(self, client_ip: str | None, email: str | None) -> None: ...

    async def record_failed_sign_in(self, client_ip: str | None, email: str | None) -> None: ...


def present(**fields: Any) -> dict[str, Any]:
    """The fields of a view whose value is not None: the spec's "absent" is absent on the wire."""
    return {name: value for name, value in fields.items() if value is not None}


def project_view(project: Project, grant: ProjectGrant | None) -> api.Project:
    return api.Project.of(present(
        id=project.id,
        org_id=project.org_id,
        slug=project.slug,
        name=project.name,
        short=project.short,
        namespace=project.namespace,
        created_at=rfc3339(project.created_at),
        your_role=(grant.resource_role or None) if grant else None,
        your_metadata_role=(grant.metadata_role or None) if grant else None,
    ))


def service_account_email(sa: ServiceAccount, short: str) -> str:
    return f"{sa.name}@{short}.cai.local"


class ProjectService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        provisioner: ProjectProvisioner,
        hooks: AgentHooks,
        *,
        usage: UsageFn | None = None,
        sign_in_guard: SignInGuard | None = None,
        on_delete: list[Callable[[str], Awaitable[Any]]] | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.provisioner = provisioner
        self.hooks = hooks
        # The "used" side of the quota view: the workload runtime's `usage(namespace)`.
        self.usage = usage
        # Invitation accept is throttled like sign-in: a bad or used token counts as a failed attempt.
        self.sign_in_guard = sign_in_guard
        # What other areas hold in a project being deleted (services, topics, memory stores, indexes, MCP
        # servers, secrets): each `purge_project(project_id)` runs before the project row goes, since
        # deleting the row cascades their records away; each is best effort.
        self.on_delete = on_delete if on_delete is not None else []

    # -- helpers ----------------------------------------------------------------------------------

    async def _grant(
        self, principal: Principal, project_id: str, need: Role | None, axis: Axis = Axis.RESOURCE, *, human: bool = False
    ) -> ProjectGrant:
        return await self.access.project_grant(principal, project_id, need, axis=axis, human=human)

    def _project(self, session: Session, grant: ProjectGrant) -> Project:
        project = session.get(Project, grant.project.id)
        if project is None:
            raise NotFound("not found")
        return project

    @staticmethod
    def spec(project: Project) -> ProjectSpec:
        quota = (project.settings or {}).get(QUOTA_KEY) or FALLBACK_QUOTA
        return ProjectSpec(project.id, project.slug, project.short, project.org_id, dict(quota))

    # -- projects ---------------------------------------------------------------------------------

    async def list(self, principal: Principal, page_size: int | str | None = None, page_token: str | None = None) -> api.ProjectList:
        self.access.require_management(principal)
        request = self.pager.request("projects", page_size, page_token)

        def fetch(session: Session) -> Page[api.Project]:
            grants = self.access.visible_projects_sync(session, principal)
            page = self.pager.page(grants, request)
            return Page([project_view(self._project(session, g), g) for g in page.items], page.next_page_token)

        page = await self.db.run(fetch)
        return api.ProjectList(projects=page.items, next_page_token=page.next_page_token)

    async def get(self, principal: Principal, project_id: str) -> api.Project:
        grant = await self._grant(principal, project_id, None)
        return await self.db.run(lambda s: project_view(self._project(s, grant), grant))

    async def create(self, principal: Principal, body: api.ProjectCreate) -> api.ProjectCreated:
        self.access.require_management(principal)
        slug, name = body.slug, body.name
        now = self.clock.now()

        def create(session: Session) -> tuple[Project, ProjectGrant, str | None]:
            authority = self.access.org_authority_sync(session, principal)
            if body.org_id is not None:
                org = session.get(Org, body.org_id)
                if org is None:
                    raise BadRequest(f"{BODY_ORG_ID_MESSAGE} (no such organization)")
            else:
                home = authority.home_org
                if home is None and principal.kind is PrincipalKind.AUTOMATION:
                    home = session.scalar(select(Org.id).where(Org.slug == DEFAULT_SLUG))
                if home is None:
                    raise Forbidden("you have no home organization; pass org_id to choose one you administer")
                org = session.get(Org, home)
                if org is None:
                    raise Forbidden("you have no home organization; pass org_id to choose one you administer")
            if not authority.may_create_project_in(org.id):
                raise Forbidden("creating a project requires the org admin role")
            if slug == DEFAULT_SLUG:
                raise Conflict(RESERVED_SLUG_MESSAGE)
            if session.scalar(select(Project).where(Project.slug == slug)) is not None:
                raise Conflict(f"a project with slug {slug} already exists")
            project = Project(
                org_id=org.id,
                slug=slug,
                name=name,
                short=new_short(session),
                created_at=now,
                settings={QUOTA_KEY: dict(DEFAULT_QUOTA), PLATFORM_CLOUD_KEY: default_cloud_mapping()},
            )
            session.add(project)
            session.flush()
            self.audit.record(session, project.id, principal, "project.create", slug, {"org": org.slug})
            note = None
            if org.id not in authority.org_admin and principal.kind is PrincipalKind.USER:
                note = (
                    "you hold no role inside this project (a platform admin has metadata authority only); "
                    "add an administrator with POST /v1/projects/" + project.id + "/members"
                )
            return project, self.access.grant_sync(session, principal, project), note

        project, grant, note = await self.db.run(create)
        warning = await self._provision(project)
        return api.ProjectCreated.of(present(project=project_view(project, grant), warning=warning or None, note=note))

    async def provision_unrecorded(self) -> int:
        """Provision projects that have no provisioning record (the bootstrap default project, or a
        project whose create was interrupted); run at platform start. Returns how many it provisioned."""
        projects = await self.db.run(
            lambda s: [p for p in s.scalars(select(Project)) if "provisioning" not in (p.settings or {})]
        )
        for project in projects:
            await self._provision(project)
        return len(projects)

    async def _provision(self, project: Project) -> str | None:
        """Run the provisioning steps and record the outcome; returns the warning, if any."""
        report = await self.provisioner.provision(self.spec(project))

        def remember(session: Session) -> None:
            row = session.get(Project, project.id)
            if row is not None:
                row.settings = {**(row.settings or {}), "provisioning": {"done": report.done, "failed": report.failed}}

        try:
            await self.db.run(remember)
        except Exception:  # noqa: BLE001 - the record of provisioning is informational
            log.exception("could not record provisioning of project %s", project.slug)
        return report.warning

    async def update(self, principal: Principal, project_id: str, body: api.ProjectPatch) -> api.ProjectUpdated:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        slug, name = body.slug, body.name

        def update(session: Session) -> api.ProjectUpdated:
            project = self._project(session, grant)
            changes: dict[str, Any] = {}
            if slug is not None and slug != project.slug:
                if project.slug == DEFAULT_SLUG or slug == DEFAULT_SLUG:
                    raise Conflict(RESERVED_SLUG_MESSAGE)
                if session.scalar(select(Project).where(Project.slug == slug)) is not None:
                    raise Conflict(f"a project with slug {slug} already exists")
                changes["slug"] = [project.slug, slug]
                project.slug = slug
            if name is not None and name != project.name:
                changes["name"] = [project.name, name]
                project.name = name
            if not changes:
                return api.ProjectUpdated(project=project_view(project, grant), note="nothing changed")
            session.flush()
            self.audit.record(session, project.id, principal, "project.rename", project.slug, changes)
            return api.ProjectUpdated(
                project=project_view(project, grant),
                note="renamed; short and namespace never change, so running workloads are unaffected",
            )

        return await self.db.run(update)

    async def delete(self, principal: Principal, project_id: str) -> api.ProjectDeleted:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        if grant.project.slug == DEFAULT_SLUG:
            raise Forbidden("the default project cannot be deleted")
        if self.hooks.project_agents is not None:
            agents = await self.hooks.project_agents(grant.project.id)
            if agents:
                raise Conflict(f"project still has agents ({', '.join(sorted(agents))}) - delete them first")

        # The other areas remove what the project holds first: their records (which name the processes,
        # streams and collections to remove) are cascaded away with the project row.
        for purge in self.on_delete:
            await self._best_effort(purge, grant.project.id, grant.project.slug)

        def delete(session: Session) -> ProjectSpec:
            project = self._project(session, grant)
            spec = self.spec(project)
            session.delete(project)  # members, keys, service accounts, invitations: ON DELETE CASCADE
            session.flush()
            self.audit.record(session, project.id, principal, "project.delete", project.slug)
            return spec

        spec = await self.db.run(delete)
        await self._best_effort(lambda pid: self.provisioner.deprovision(spec), spec.id, spec.slug)
        return api.ProjectDeleted(deleted=True, project=spec.slug)

    @staticmethod
    async def _best_effort(cleanup: Callable[[str], Awaitable[Any]], project_id: str, slug: str) -> None:
        try:
            await cleanup(project_id)
        except Exception:  # noqa: BLE001 - the project goes anyway; leftovers are logged, not fatal
            log.exception("cleanup of deleted project %s failed", slug)

    # -- cloud-credential mapping -----------------------------------------------------------------

    @staticmethod
    def _cloud_body(project: Project, note: str | None = None) -> api.CloudMapping:
        settings = project.settings or {}
        mapping = settings.get(PLATFORM_CLOUD_KEY)
        body: dict[str, Any] = {"project": project.slug, "mapped": mapping is not None, "mapping": mapping}
        if note:
            body["note"] = note
        return api.CloudMapping.of(body)

    async def get_cloud(self, principal: Principal, project_id: str) -> api.CloudMapping:
        grant = await self._grant(principal, project_id, None)
        return await self.db.run(lambda s: self._cloud_body(self._project(s, grant)))

    async def map_cloud(self, principal: Principal, project_id: str, body: api.CloudMappingPut) -> api.CloudMapping:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        mapping = body.mapping()

        def save(session: Session) -> api.CloudMapping:
            project = self._project(session, grant)
            project.settings = {**(project.settings or {}), PLATFORM_CLOUD_KEY: mapping}
            self.audit.record(session, project.id, principal, "project.platform-cloud.map", project.slug, mapping)
            return self._cloud_body(project, "mapped; the next deploy uses this credential")

        return await self.db.run(save)

    async def unmap_cloud(self, principal: Principal, project_id: str) -> api.CloudMapping:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)

        def clear(session: Session) -> api.CloudMapping:
            project = self._project(session, grant)
            project.settings = {**(project.settings or {}), PLATFORM_CLOUD_KEY: None}
            self.audit.record(session, project.id, principal, "project.platform-cloud.unmap", project.slug)
            return self._cloud_body(project, "unmapped; deploys are refused until a credential is mapped again")

        return await self.db.run(clear)

    # -- members ----------------------------------------------------------------------------------

    def _member_view(self, row: ProjectMember, user: User | None, sa: ServiceAccount | None, short: str) -> api.ProjectMember:
        if sa is not None:
            who: dict[str, Any] = dict(
                user_id=sa.id, email=service_account_email(sa, short), kind="service_account", service_account_id=sa.id, external=False
            )
        else:
            assert user is not None
            who = dict(user_id=user.id, email=user.email, kind="user", external=user.org_id is None)
        glass: dict[str, Any] = {}
        if row.break_glass:
            glass = dict(
                break_glass=True,
                expires_at=rfc3339(row.expires_at) if row.expires_at else None,
                reason=row.reason or "",
                granted_by=row.granted_by or "",
                expired=True if row.expires_at is None or row.expires_at <= self.clock.now() else None,
            )
        return api.ProjectMember.of(present(role=row.role, created_at=rfc3339(row.created_at), **who, **glass))

    def _members_sync(self, session: Session, project: Project) -> builtins.list[api.ProjectMember]:
        rows = session.execute(
            select(ProjectMember, User, ServiceAccount)
            .outerjoin(User, User.id == ProjectMember.user_id)
            .outerjoin(ServiceAccount, ServiceAccount.id == ProjectMember.service_account_id)
            .where(ProjectMember.project_id == project.id)
            .order_by(ProjectMember.created_at, ProjectMember.id)
        ).all()
        return [self._member_view(m, u, sa, project.short) for m, u, sa in rows]

    async def list_members(
        self, principal: Principal, project_id: str, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.ProjectMemberList:
        grant = await self._grant(principal, project_id, None)
        request = self.pager.request(f"members:{grant.project.id}", page_size, page_token)
        items = await self.db.run(lambda s: self._members_sync(s, self._project(s, grant)))
        page = self.pager.page(items, request)
        return api.ProjectMemberList(members=page.items, next_page_token=page.next_page_token)

    @staticmethod
    def _real_admins(session: Session, project_id: str) -> int:
        """Admins that count for the last-admin guard: no break-glass, no service accounts."""
        return (
            session.scalar(
                select(func.count())
                .select_from(ProjectMember)
                .where(
                    ProjectMember.project_id == project_id,
                    ProjectMember.user_id.is_not(None),
                    ProjectMember.role == "admin",
                    ProjectMember.break_glass.is_(False),
                )
            )
            or 0
        )

    async def add_member(self, principal: Principal, project_id: str, body: api.MemberAdd) -> api.MemberAdded:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        email, role = body.email, body.role
        now = self.clock.now()

        def add(session: Session) -> api.MemberAdded:
            project = self._project(session, grant)
            user = session.scalar(select(User).where(User.email == email))
            if user is None:
                raise NotFound(f"no account exists for {email} - invite them instead")
            return self._grant_user(session, principal, project, user, role, now)

        return await self.db.run(add)

    def _grant_user(
        self, session: Session, principal: Principal | None, project: Project, user: User, role: str, now: Any, note: str | None = None
    ) -> api.MemberAdded:
        existing = session.scalar(
            select(ProjectMember).where(
                ProjectMember.project_id == project.id,
                ProjectMember.user_id == user.id,
                ProjectMember.break_glass.is_(False),
            )
        )
        if existing is not None:
            raise Conflict(f"{user.email} is already a member of this project (role {existing.role})")
        row = ProjectMember(project_id=project.id, user_id=user.id, role=role, created_at=now)
        session.add(row)
        session.flush()
        self.audit.record(session, project.id, principal, "project.member.add", user.email, {"role": role})
        return api.MemberAdded(
            member=self._member_view(row, user, None, project.short),
            note=note or f"{user.email} now holds the {role} role on {project.slug}",
        )

    def _user_rows(self, session: Session, project: Project, user_id: str) -> builtins.list[ProjectMember]:
        rows = list(
            session.scalars(select(ProjectMember).where(ProjectMember.project_id == project.id, ProjectMember.user_id == user_id))
        ) if validation.is_uuid(user_id) else []
        if not rows:
            raise NotFound("not a member of this project")
        return rows

    async def set_member_role(
        self, principal: Principal, project_id: str, user_id: str, body: api.MemberRolePatch
    ) -> api.MemberRoleChanged:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        role = body.role

        def update(session: Session) -> api.MemberRoleChanged:
            project = self._project(session, grant)
            rows = self._user_rows(session, project, user_id)
            real = [r for r in rows if not r.break_glass]
            target = real[0] if real else rows[0]
            if target.role == "admin" and role != "admin" and not target.break_glass and self._real_admins(session, project.id) <= 1:
                raise Conflict(LAST_ADMIN_MESSAGE)
            if target.role != role:
                target.role = role
                user = session.get(User, user_id)
                self.audit.record(session, project.id, principal, "project.member.role", user.email if user else user_id, {"role": role})
            return api.MemberRoleChanged(user_id=user_id, role=role)

        return await self.db.run(update)

    async def remove_member(self, principal: Principal, project_id: str, user_id: str) -> api.MemberRemoved:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)

        def remove(session: Session) -> api.MemberRemoved:
            project = self._project(session, grant)
            rows = self._user_rows(session, project, user_id)
            removes_real_admin = any(r.role == "admin" and not r.break_glass for r in rows)
            if removes_real_admin and self._real_admins(session, project.id) <= 1:
                raise Conflict(LAST_ADMIN_MESSAGE)
            for row in rows:
                session.delete(row)
            user = session.get(User, user_id)
            self.audit.record(session, project.id, principal, "project.member.remove", user.email if user else user_id)
            return api.MemberRemoved(deleted=True, user_id=user_id, note="the grant is gone; it stops working on the next request")

        return await self.db.run(remove)

    def _sa_row(self, session: Session, project: Project, sa_id: str) -> tuple[ServiceAccount, ProjectMember]:
        sa = session.get(ServiceAccount, sa_id) if validation.is_uuid(sa_id) else None
        row = None
        if sa is not None and sa.project_id == project.id:
            row = session.scalar(
                select(ProjectMember).where(ProjectMember.project_id == project.id, ProjectMember.service_account_id == sa.id)
            )
        if sa is None or row is None:
            raise NotFound("no such service account grant in this project")
        return sa, row

    async def set_sa_role(
        self, principal: Principal, project_id: str, sa_id: str, body: api.MemberRolePatch
    ) -> api.ServiceAccountRole:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        role = body.role

        def update(session: Session) -> api.ServiceAccountRole:
            project = self._project(session, grant)
            sa, row = self._sa_row(session, project, sa_id)
            if row.role != role:
                row.role = role
                self.audit.record(session, project.id, principal, "project.member.sa.role", service_account_email(sa, project.short), {"role": role})
            return api.ServiceAccountRole(service_account_id=sa.id, role=role)

        return await self.db.run(update)

    async def remove_sa_grant(self, principal: Principal, project_id: str, sa_id: str) -> api.ServiceAccountGrantRemoved:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)

        def remove(session: Session) -> api.ServiceAccountGrantRemoved:
            project = self._project(session, grant)
            sa, row = self._sa_row(session, project, sa_id)
            session.delete(row)
            self.audit.record(session, project.id, principal, "project.member.sa.remove", service_account_email(sa, project.short))
            return api.ServiceAccountGrantRemoved(
                deleted=True,
                service_account_id=sa.id,
                note="only the grant was removed; the service account and its keys remain, without authority",
            )

        return await self.db.run(remove)

    # -- break-glass ------------------------------------------------------------------------------

    async def break_glass(self, principal: Principal, project_id: str, body: api.BreakGlassRequest) -> api.BreakGlassGrant:
        self.access.require_human(principal)
        if principal.kind is not PrincipalKind.USER:
            raise Forbidden("break-glass needs a person's credentials (a session or a personal key)")
        grant = await self.access.project(principal, project_id, need=None)
        reason, role, minutes = body.reason, body.role, body.minutes
        now = self.clock.now()

        def grant_it(session: Session) -> api.BreakGlassGrant:
            if not self.access.is_platform_admin(session, principal):
                raise Forbidden(
                    "you hold no platform admin role to escalate from (break-glass is for a platform admin "
                    "repairing a project they are not a member of)"
                )
            if grant.resource_role is not None:
                raise Forbidden("you already hold a grant on this project; break-glass is for projects you are not a member of")
            project = self._project(session, grant)
            user = session.get(User, principal.user_id)
            expires_at = now + timedelta(minutes=minutes)
            row = ProjectMember(
                project_id=project.id,
                user_id=principal.user_id,
                role=role,
                break_glass=True,
                expires_at=expires_at,
                reason=reason,
                granted_by=user.email if user else "",
                created_at=now,
            )
            session.add(row)
            session.flush()
            self.audit.record(
                session, project.id, principal, "project.break-glass", user.email if user else "",
                {"role": role, "minutes": minutes, "reason": reason},
            )
            return api.BreakGlassGrant(
                grant=self._member_view(row, user, None, project.short),
                note=(
                    f"break-glass {role} grant until {rfc3339(expires_at)}; it is visible to project members, "
                    "audited, and stays listed as history after it expires; remove it early with the member delete route"
                ),
            )

        return await self.db.run(grant_it)

    # -- invitations ------------------------------------------------------------------------------

    def _invitation_state(self, inv: Invitation) -> str:
        if inv.state == "open" and inv.expires_at <= self.clock.now():
            return "expired"
        return inv.state

    def _invitation_view(self, inv: Invitation, token: str | None = None) -> api.Invitation:
        return api.Invitation.of(present(
            id=inv.id,
            email=inv.email,
            role=inv.role,
            state=self._invitation_state(inv),
            created_at=rfc3339(inv.created_at),
            expires_at=rfc3339(inv.expires_at),
            accept_url=f"/invite/{token}" if token else None,
            token=token,
        ))

    async def list_invitations(
        self, principal: Principal, project_id: str, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.InvitationList:
        grant = await self._grant(principal, project_id, None)
        request = self.pager.request(f"invitations:{grant.project.id}", page_size, page_token)

        def fetch(session: Session) -> builtins.list[api.Invitation]:
            rows = session.scalars(
                select(Invitation).where(Invitation.project_id == grant.project.id).order_by(Invitation.created_at.desc(), Invitation.id)
            )
            return [self._invitation_view(i) for i in rows]

        page = self.pager.page(await self.db.run(fetch), request)
        return api.InvitationList(invitations=page.items, next_page_token=page.next_page_token)

    async def invite(self, principal: Principal, project_id: str, body: api.InvitationCreate) -> api.InvitationSent:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)
        email, role = body.email, body.role
        now = self.clock.now()

        def invite(session: Session) -> api.InvitationSent:
            project = self._project(session, grant)
            user = session.scalar(select(User).where(User.email == email))
            if user is not None:
                granted = self._grant_user(
                    session, principal, project, user, role, now,
                    note=f"{email} already has an account, so the role was granted directly; no invitation was sent",
                )
                return api.InvitationSent(member=granted.member, note=granted.note)
            token = token_source.token_urlsafe(32)
            inv = Invitation(
                project_id=project.id,
                email=email,
                role=role,
                token_hash=security.hash_secret(token),
                state="open",
                invited_by=principal.email,
                created_at=now,
                expires_at=now + timedelta(days=INVITATION_DAYS),
            )
            session.add(inv)
            session.flush()
            self.audit.record(session, project.id, principal, "project.invite", email, {"role": role})
            return api.InvitationSent(
                invitation=self._invitation_view(inv, token),
                note=f"send the accept link to {email}; the token is shown only once and expires in {INVITATION_DAYS} days",
            )

        return await self.db.run(invite)

    async def revoke_invitation(self, principal: Principal, project_id: str, invitation_id: str) -> api.InvitationRevoked:
        grant = await self._grant(principal, project_id, Role.ADMIN, Axis.METADATA, human=True)

        def revoke(session: Session) -> api.InvitationRevoked:
            inv = session.get(Invitation, invitation_id) if validation.is_uuid(invitation_id) else None
            if inv is None or inv.project_id != grant.project.id:
                raise NotFound("invitation not found")
            state = self._invitation_state(inv)
            if state != "open":
                raise Gone(f"this invitation is already {state}")
            inv.state = "revoked"
            self.audit.record(session, grant.project.id, principal, "project.invite.revoke", inv.email)
            return api.InvitationRevoked(invitation=self._invitation_view(inv), note="the link no longer works")

        return await self.db.run(revoke)

    def _open_invitation(self, session: Session, token: Any) -> Invitation:
        inv = None
        if isinstance(token, str) and token:
            inv = session.scalar(select(Invitation).where(Invitation.token_hash == security.hash_secret(token)))
        if inv is None:
            raise NotFound("invalid invitation link")
        state = self._invitation_state(inv)
        if state == "accepted":
            raise Gone("this invitation has already been used")
        if state == "revoked":
            raise Gone("this invitation has been revoked")
        if state == "expired":
            raise Gone("this invitation has expired; ask for a new one")
        return inv

    async def preview_invitation(self, token: str) -> api.InvitationPreview:
        def preview(session: Session) -> api.InvitationPreview:
            inv = self._open_invitation(session, token)
            project = session.get(Project, inv.project_id)
            exists = session.scalar(select(User).where(User.email == inv.email)) is not None
            return api.InvitationPreview(
                project_name=project.name if project else "",
                project_slug=project.slug if project else "",
                email=inv.email,
                role=inv.role,
                expires_at=rfc3339(inv.expires_at),
                account_exists=exists,
            )

        return await self.db.run(preview)

    async def accept_invitation(self, body: api.InvitationAccept, client_ip: str | None = None) -> api.InvitationAccepted:
        if self.sign_in_guard is not None:
            await self.sign_in_guard.throttle_sign_in(client_ip, None)
        try:
            return await self._accept(body)
        except (NotFound, Gone):
            if self.sign_in_guard is not None:
                await self.sign_in_guard.record_failed_sign_in(client_ip, None)
            raise

    async def _accept(self, body: api.InvitationAccept) -> api.InvitationAccepted:
        token, password = body.token, body.password
        now = self.clock.now()

        def accept(session: Session) -> api.InvitationAccepted:
            inv = self._open_invitation(session, token)
            project = session.get(Project, inv.project_id)
            user = session.scalar(select(User).where(User.email == inv.email))
            note = f"you now hold the {inv.role} role on {project.slug if project else 'the project'}"
            if user is None:
                user = User(
                    email=inv.email,
                    password_hash=security.hash_password(validation.password(password)),
                    role="user",
                    must_change_password=False,  # the invitee chose this password themselves
                    org_id=None,
                    created_at=now,
                )
                session.add(user)
                session.flush()
                note += "; your account was created - sign in with this e-mail and password"
            else:
                note += "; your existing password is unchanged"
            has = session.scalar(
                select(ProjectMember).where(
                    ProjectMember.project_id == inv.project_id, ProjectMember.user_id == user.id, ProjectMember.break_glass.is_(False)
                )
            )
            if has is None:
                session.add(ProjectMember(project_id=inv.project_id, user_id=user.id, role=inv.role, created_at=now))
            inv.state = "accepted"
            actor = Principal(kind=PrincipalKind.USER, user_id=user.id, email=user.email)
            self.audit.record(session, inv.project_id, actor, "invitation.accept", inv.email, {"role": inv.role})
            return api.InvitationAccepted(accepted=True, project_id=inv.project_id, role=inv.role, email=inv.email, note=note)

        return await self.db.run(accept)

    # -- quota and audit --------------------------------------------------------------------------

    async def quota(self, principal: Principal, project_id: str) -> api.ProjectQuota:
        grant = await self._grant(principal, project_id, Role.MEMBER)
        project = await self.db.run(lambda s: self._project(s, grant))
        hard = (project.settings or {}).get(QUOTA_KEY) or FALLBACK_QUOTA
        used = await self.usage(project.namespace) if self.usage else {}
        order = list(QUOTA_LABELS)
        quotas = []
        for resource in sorted(hard, key=lambda r: (order.index(r) if r in order else len(order), r)):
            hard_value = parse_quantity(resource, str(hard[resource]))
            used_value = int(used.get(resource, 0))
            pct = int(used_value * 100 / hard_value) if hard_value > 0 else 0
            used_text = format_quantity(resource, used_value)
            hard_text = str(hard[resource])
            # Document 2: `display` is the resource's label; the numbers stay in used, hard and used_pct.
            display = QUOTA_LABELS.get(resource, resource)
            quotas.append(api.QuotaEntry(resource=resource, used=used_text, hard=hard_text, used_pct=pct, display=display))
        note = "live from enforcement; read-only" if self.usage else "usage is not reported by this platform's workload runtime, so used reads 0"
        return api.ProjectQuota(project=project.slug, namespace=project.namespace, quotas=quotas, note=note)

    async def audit_log(
        self, principal: Principal, project_id: str, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.AuditEntryList:
        grant = await self._grant(principal, project_id, Role.MEMBER)
        request = self.pager.request(f"audit:{grant.project.id}", page_size, page_token)

        def fetch(session: Session) -> Page[api.AuditEntry]:
            rows = list(
                session.scalars(
                    select(AuditEntry)
                    .where(AuditEntry.project_id == grant.project.id)
                    .order_by(AuditEntry.id.desc())
                    .offset(request.offset)
                    .limit(request.size + 1)
                )
            )
            page = self.pager.page_from_probe(rows, request)
            items = [
                api.AuditEntry(ts=rfc3339(e.ts), actor=e.actor, action=e.action, target=e.target, detail=e.detail)
                for e in page.items
            ]
            return Page(items, page.next_page_token)

        page = await self.db.run(fetch)
        return api.AuditEntryList(entries=page.items, next_page_token=page.next_page_token)
