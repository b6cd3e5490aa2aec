"""Accounts and organizations (document 2, "Users" and "Organizations").

Users carry a platform role (`admin` or `user`) and a home organization (none for outsiders who joined
by invitation: `external`). Organizations group projects; an org admin inherits admin on every project
of the org, resolved live by `Access`. Every guard that keeps the platform manageable lives here: the
last platform admin cannot be demoted or deleted, the only org admin cannot be demoted or removed, the
default organization cannot be deleted.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from caiplatform import security, validation
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import Org, OrgMember, Project, ProjectMember, User
from caiplatform.errors import BadRequest, Conflict, Forbidden, NotFound
from caiplatform.models import accounts as api
from caiplatform.models.accounts import BODY_ORG_ID_MESSAGE, org_uuid
from caiplatform.models.base import ResponseModel
from caiplatform.pagination import Page, Pager
from caiplatform.principal import Principal
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog
from caiplatform.services.auth import DEFAULT_SLUG


@dataclass
class AgentHooks:
    """What the accounts and projects views need from the agents area (empty until it registers).

    - `project_agents(project_id)`: names of a project's agents (project delete refuses while any exist);
    - `user_agents(user_id)`: `(project_id, name)` of the agents a user deployed;
    - `unowned_agents()`: agents with no recorded owner (`GET /v1/users`), as agent views.
    """

    project_agents: Callable[[str], Awaitable[list[str]]] | None = None
    user_agents: Callable[[str], Awaitable[list[tuple[str, str]]]] | None = None
    unowned_agents: Callable[[], Awaitable[Sequence[Mapping[str, Any] | ResponseModel]]] | None = None


def _agent_json(view: Mapping[str, Any] | ResponseModel) -> dict[str, Any]:
    return view.to_json() if isinstance(view, ResponseModel) else dict(view)


def user_projects_sync(session: Session, user: User, now: datetime) -> list[str]:
    """Slugs of the projects a user holds a grant on: direct rows (live break-glass included) and org-admin inheritance."""
    direct = select(ProjectMember.project_id).where(
        ProjectMember.user_id == user.id,
        ProjectMember.break_glass.is_(False) | (ProjectMember.expires_at > now),
    )
    admin_orgs = select(OrgMember.org_id).where(OrgMember.user_id == user.id, OrgMember.role == "admin")
    rows = session.scalars(
        select(Project.slug).where(Project.id.in_(direct) | Project.org_id.in_(admin_orgs)).order_by(Project.slug)
    )
    return list(rows)


class AccountService:
    def __init__(self, db: Database, access: Access, audit: AuditLog, clock: Clock, pager: Pager, hooks: AgentHooks):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.hooks = hooks

    # -- views ------------------------------------------------------------------------------------

    def _user_view(self, session: Session, user: User, agents: list[str]) -> api.User:
        view: dict[str, Any] = {
            "id": user.id,
            "email": user.email,
            "role": user.role,
            "must_change_password": user.must_change_password,
            "external": user.org_id is None,
            "created_at": rfc3339(user.created_at),
            "projects": user_projects_sync(session, user, self.clock.now()),
            "agents": agents,
            "agent_count": len(agents),
        }
        if user.org_id is not None:
            view["org_id"] = user.org_id
        return api.User.of(view)

    async def _agents_by_user(self, principal: Principal) -> dict[str, list[str]]:
        """Agent names per user, limited to projects where the caller holds resource authority."""
        if self.hooks.user_agents is None:
            return {}
        grants = await self.db.run(lambda s: self.access.visible_projects_sync(s, principal))
        allowed = {g.project.id for g in grants if g.resource_role}
        users = await self.db.run(lambda s: list(s.scalars(select(User.id))))
        result: dict[str, list[str]] = {}
        for user_id in users:
            names = sorted({name for project_id, name in await self.hooks.user_agents(user_id) if project_id in allowed})
            result[user_id] = names
        return result

    @staticmethod
    def _org_view(session: Session, org: Org) -> api.Org:
        return api.Org(
            id=org.id,
            slug=org.slug,
            name=org.name,
            created_at=rfc3339(org.created_at),
            projects=session.scalar(select(func.count()).select_from(Project).where(Project.org_id == org.id)) or 0,
            users=session.scalar(select(func.count()).select_from(User).where(User.org_id == org.id)) or 0,
        )

    @staticmethod
    def _member_view(member: OrgMember, user: User) -> api.OrgMember:
        return api.OrgMember(user_id=user.id, email=user.email, role=member.role, created_at=rfc3339(member.created_at))

    # -- users ------------------------------------------------------------------------------------

    async def list_users(
        self, principal: Principal, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.UserList:
        await self.access.require_platform_admin(principal)
        request = self.pager.request("users", page_size, page_token)
        agents = await self._agents_by_user(principal)

        def fetch(session: Session) -> Page[api.User]:
            users = list(session.scalars(select(User).order_by(User.email)))
            page = self.pager.page(users, request)
            return Page([self._user_view(session, u, agents.get(u.id, [])) for u in page.items], page.next_page_token)

        page = await self.db.run(fetch)
        unowned = await self.hooks.unowned_agents() if self.hooks.unowned_agents else []
        return api.UserList(users=page.items, unowned_agents=[_agent_json(a) for a in unowned],
                            next_page_token=page.next_page_token)

    async def create_user(self, principal: Principal, body: api.UserCreate) -> api.UserCreated:
        self.access.require_human(principal)
        now = self.clock.now()

        def create(session: Session) -> api.UserCreated:
            authority = self.access.org_authority_sync(session, principal)
            if not authority.may_create_accounts():
                raise Forbidden("creating an account requires administering an organization or a project")
            email, role = body.email, body.role
            if role == "admin" and not authority.platform:
                raise Forbidden("only a platform admin can create a platform admin")
            password = body.password
            temporary = None
            if password is None:
                temporary = password = security.generate_password()
            org_id: str | None  # None only when the default org is missing: the user gets no org
            if body.org_id is not None:
                org_id = body.org_id
                if session.get(Org, org_id) is None:
                    raise BadRequest(f"{BODY_ORG_ID_MESSAGE} (no such organization)")
            else:
                org_id = authority.home_org
                if org_id is None:  # the automation token and external users: the default org
                    org_id = session.scalar(select(Org.id).where(Org.slug == DEFAULT_SLUG))
            if not authority.may_create_account_in(org_id):
                raise Forbidden("creating in that organization requires administering it")
            if session.scalar(select(User).where(User.email == email)) is not None:
                raise Conflict(
                    f"an account already exists for {email}; add the existing account to the project instead"
                )
            user = User(
                email=email,
                password_hash=security.hash_password(password),
                role=role,
                must_change_password=True,
                org_id=org_id,
                created_at=now,
            )
            session.add(user)
            session.flush()
            if org_id:
                session.add(OrgMember(org_id=org_id, user_id=user.id, role="member", created_at=now))
                session.flush()
            self.audit.record(session, None, principal, "user.create", email, {"role": role, "org_id": org_id})
            if temporary:
                return api.UserCreated(
                    user=self._user_view(session, user, []),
                    temporary_password=temporary,
                    note="a temporary password was generated and is shown only once; the user must change it at first sign-in",
                )
            return api.UserCreated(user=self._user_view(session, user, []), note="the user must change this password at first sign-in")

        return await self.db.run(create)

    @staticmethod
    def _user_by_email(session: Session, email: str) -> User:
        user = session.scalar(select(User).where(User.email == (email or "").strip().lower()))
        if user is None:
            raise NotFound("user not found")
        return user

    @staticmethod
    def _admin_count(session: Session) -> int:
        return session.scalar(select(func.count()).select_from(User).where(User.role == "admin")) or 0

    async def set_role(self, principal: Principal, email: str, body: api.UserRolePatch) -> api.UserRoleChanged:
        await self.access.require_platform_admin(principal)
        role = body.role

        def update(session: Session) -> api.UserRoleChanged:
            user = self._user_by_email(session, email)
            if user.role == "admin" and role != "admin":
                if user.id == principal.user_id:
                    raise BadRequest("cannot remove your own admin role - ask another admin to do it")
                if self._admin_count(session) <= 1:
                    raise Conflict("cannot demote the last admin - promote another account first")
            changed = user.role != role
            user.role = role
            if changed:
                self.audit.record(session, None, principal, "user.role", user.email, {"role": role})
            return api.UserRoleChanged(
                user=self._user_view(session, user, []), note="effective immediately" if changed else "nothing changed"
            )

        return await self.db.run(update)

    async def delete_user(self, principal: Principal, email: str) -> api.UserDeleted:
        await self.access.require_platform_admin(principal)

        def delete(session: Session) -> api.UserDeleted:
            user = self._user_by_email(session, email)
            if user.id == principal.user_id:
                raise BadRequest("cannot delete the signed-in account")
            if user.role == "admin" and self._admin_count(session) <= 1:
                raise Conflict("cannot delete the last admin - promote another account first")
            address = user.email
            session.delete(user)  # grants, org memberships and keys go with it (ON DELETE CASCADE)
            session.flush()
            self.audit.record(session, None, principal, "user.delete", address)
            return api.UserDeleted(
                deleted=address, note="the account, its grants and its keys were removed; agents it deployed keep running; to erase what a "
                     "user id said to agents, use POST /v1/projects/{projectID}/forget"
            )

        return await self.db.run(delete)

    async def reset_password(self, principal: Principal, email: str) -> api.PasswordReset:
        await self.access.require_platform_admin(principal)

        def reset(session: Session) -> api.PasswordReset:
            user = self._user_by_email(session, email)
            temporary = security.generate_password()
            user.password_hash = security.hash_password(temporary)
            user.must_change_password = True
            self.audit.record(session, None, principal, "user.reset-password", user.email)
            return api.PasswordReset(
                email=user.email, temporary_password=temporary, note="shown only once; the user must change it at the next sign-in"
            )

        return await self.db.run(reset)

    # -- organizations ---------------------------------------------------------------------------

    async def list_orgs(
        self, principal: Principal, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.OrgList:
        await self.access.require_platform_admin(principal)
        request = self.pager.request("orgs", page_size, page_token)

        def fetch(session: Session) -> Page[api.Org]:
            page = self.pager.page(list(session.scalars(select(Org).order_by(Org.slug))), request)
            return Page([self._org_view(session, o) for o in page.items], page.next_page_token)

        page = await self.db.run(fetch)
        return api.OrgList(orgs=page.items, next_page_token=page.next_page_token)

    async def create_org(self, principal: Principal, body: api.OrgCreate) -> api.OrgCreated:
        await self.access.require_platform_admin(principal)
        slug, name = body.slug, body.name or body.slug
        now = self.clock.now()

        def create(session: Session) -> api.OrgCreated:
            if session.scalar(select(Org).where(Org.slug == slug)) is not None:
                raise Conflict(f"an organization with slug {slug} already exists")
            org = Org(slug=slug, name=name, created_at=now)
            session.add(org)
            session.flush()
            self.audit.record(session, None, principal, "org.create", slug)
            return api.OrgCreated(org=self._org_view(session, org))

        return await self.db.run(create)

    @staticmethod
    def _org(session: Session, org_id: str) -> Org:
        org = session.get(Org, org_uuid(org_id))
        if org is None:
            raise NotFound("organization not found")
        return org

    async def delete_org(self, principal: Principal, org_id: str) -> api.OrgDeleted:
        await self.access.require_platform_admin(principal)

        def delete(session: Session) -> api.OrgDeleted:
            org = self._org(session, org_id)
            if org.slug == DEFAULT_SLUG:
                raise Forbidden("the default organization cannot be deleted")
            if session.scalar(select(func.count()).select_from(Project).where(Project.org_id == org.id)):
                raise Conflict("organization still has projects - delete or move them first")
            if session.scalar(select(func.count()).select_from(User).where(User.org_id == org.id)):
                raise Conflict("organization still has users - delete or move them first")
            slug = org.slug
            session.delete(org)
            session.flush()
            self.audit.record(session, None, principal, "org.delete", slug)
            return api.OrgDeleted(deleted=True, org=slug)

        return await self.db.run(delete)

    async def list_org_members(
        self, principal: Principal, org_id: str, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.OrgMemberList:
        await self.access.require_platform_admin(principal)

        def fetch(session: Session) -> Page[api.OrgMember]:
            org = self._org(session, org_id)
            request = self.pager.request(f"org-members:{org.id}", page_size, page_token)
            rows = session.execute(
                select(OrgMember, User).join(User, User.id == OrgMember.user_id).where(OrgMember.org_id == org.id).order_by(User.email)
            ).all()
            page = self.pager.page(rows, request)
            return Page([self._member_view(m, u) for m, u in page.items], page.next_page_token)

        page = await self.db.run(fetch)
        return api.OrgMemberList(members=page.items, next_page_token=page.next_page_token)

    @staticmethod
    def _guard_only_admin(session: Session, org: Org, member: OrgMember) -> None:
        if member.role != "admin":
            return
        admins = session.scalar(
            select(func.count()).select_from(OrgMember).where(OrgMember.org_id == org.id, OrgMember.role == "admin")
        )
        if (admins or 0) <= 1:
            raise Conflict("this is the organization's only admin - promote someone else first")

    async def add_org_member(self, principal: Principal, org_id: str, body: api.OrgMemberAdd) -> api.OrgMemberChanged:
        """The new member (`created` set); an account that is already a member with that role is no change."""
        await self.access.require_platform_admin(principal)
        email, role = body.email, body.role
        now = self.clock.now()

        def add(session: Session) -> api.OrgMemberChanged:
            org = self._org(session, org_id)
            user = session.scalar(select(User).where(User.email == email))
            if user is None:
                raise NotFound(f"no account exists for {email}")
            member = session.get(OrgMember, (org.id, user.id))
            if member is not None:
                if member.role == role:
                    return api.OrgMemberChanged(member=self._member_view(member, user), note="already a member with that role")
                raise Conflict(f"{email} is already a member of this organization with role {member.role}; change the role instead")
            member = OrgMember(org_id=org.id, user_id=user.id, role=role, created_at=now)
            session.add(member)
            note = None
            if user.org_id is None:
                user.org_id = org.id  # an outsider gets a home organization
                note = "this organization is now the account's home organization"
            session.flush()
            self.audit.record(session, None, principal, "org.member.add", email, {"org": org.slug, "role": role})
            view = self._member_view(member, user)
            added = api.OrgMemberChanged(member=view, note=note) if note else api.OrgMemberChanged(member=view)
            added.created = True
            return added

        return await self.db.run(add)

    def _org_member(self, session: Session, org_id: str, user_id: str) -> tuple[Org, OrgMember, User]:
        org = self._org(session, org_id)
        member = session.get(OrgMember, (org.id, user_id)) if validation.is_uuid(user_id) else None
        user = session.get(User, user_id) if member else None
        if member is None or user is None:
            raise NotFound("not a member of this organization")
        return org, member, user

    async def set_org_member_role(
        self, principal: Principal, org_id: str, user_id: str, body: api.OrgMemberPatch
    ) -> api.OrgMemberChanged:
        await self.access.require_platform_admin(principal)
        role = body.role

        def update(session: Session) -> api.OrgMemberChanged:
            org, member, user = self._org_member(session, org_id, user_id)
            if member.role == role:
                return api.OrgMemberChanged(member=self._member_view(member, user), note="nothing changed")
            self._guard_only_admin(session, org, member)
            member.role = role
            self.audit.record(session, None, principal, "org.member.role", user.email, {"org": org.slug, "role": role})
            return api.OrgMemberChanged(member=self._member_view(member, user), note="effective immediately")

        return await self.db.run(update)

    async def remove_org_member(self, principal: Principal, org_id: str, user_id: str) -> api.OrgMemberRemoved:
        await self.access.require_platform_admin(principal)

        def remove(session: Session) -> api.OrgMemberRemoved:
            org, member, user = self._org_member(session, org_id, user_id)
            self._guard_only_admin(session, org, member)
            session.delete(member)
            self.audit.record(session, None, principal, "org.member.remove", user.email, {"org": org.slug})
            return api.OrgMemberRemoved(
                deleted=True, user_id=user.id, note="the account keeps its direct project grants; org-inherited access ends now"
            )

        return await self.db.run(remove)
