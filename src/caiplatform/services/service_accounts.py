"""Service accounts (machine principals of one project), their keys, and workload keys.

A service account's authority is its own project's, on the resource axis only, through its member
grant; it can never manage credentials, accounts or membership (`Access.require_human`). Names are
reserved permanently: a soft-deleted account keeps its row, and deleting revokes every key in the same
transaction. Workload keys (`cai_wl_...`) are minted by the platform at deploy for a project's
workloads and may only mint secret read tokens for that project.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import ApiKey, Project, ProjectMember, ServiceAccount
from caiplatform.errors import Conflict, NotFound
from caiplatform.models import projects as api
from caiplatform.models.accounts import ApiKeyCreate, ApiKeyCreated, ApiKeyList, ApiKeyRevoked
from caiplatform.pagination import Pager
from caiplatform.principal import Principal
from caiplatform.services.access import Access, ProjectGrant, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.credentials import (
    KEY_NOTE,
    REVOKE_NOTE,
    find_key,
    key_expiry,
    key_view,
    new_key,
)
from caiplatform.services.projects import service_account_email


class ServiceAccountService:
    def __init__(self, db: Database, access: Access, audit: AuditLog, clock: Clock, pager: Pager):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager

    async def _grant(self, principal: Principal, project_id: str, need: Role, *, manage: bool) -> ProjectGrant:
        """Listing needs membership; create, delete and key management need resource admin and a person."""
        return await self.access.project_grant(principal, project_id, need, human=manage)

    @staticmethod
    def _view(sa: ServiceAccount, short: str, role: str | None) -> api.ServiceAccount:
        view: dict[str, Any] = {
            "id": sa.id,
            "project_id": sa.project_id,
            "name": sa.name,
            "email": service_account_email(sa, short),
            "display_name": sa.display_name,
            "disabled": sa.disabled,
            "created_at": rfc3339(sa.created_at),
        }
        if role:
            view["role"] = role
        return api.ServiceAccount.of(view)

    @staticmethod
    def _role(session: Session, sa: ServiceAccount) -> str | None:
        return session.scalar(
            select(ProjectMember.role).where(
                ProjectMember.project_id == sa.project_id, ProjectMember.service_account_id == sa.id
            )
        )

    @staticmethod
    def _find(session: Session, project_id: str, ref: str, *, include_deleted: bool = False) -> ServiceAccount:
        """By id or name; a deleted account (or one of another project) is 404 unless `include_deleted`."""
        query = select(ServiceAccount).where(ServiceAccount.project_id == project_id)
        if not include_deleted:
            query = query.where(ServiceAccount.deleted_at.is_(None))
        query = query.where((ServiceAccount.name == ref) | (ServiceAccount.id == ref))
        sa = session.scalar(query)
        if sa is None:
            raise NotFound(f"service account not found: {ref}")
        return sa

    async def list(
        self, principal: Principal, project_id: str, page_size: int | str | None = None, page_token: str | None = None
    ) -> api.ServiceAccountList:
        grant = await self._grant(principal, project_id, Role.MEMBER, manage=False)
        request = self.pager.request(f"service-accounts:{grant.project.id}", page_size, page_token)

        def fetch(session: Session) -> list[api.ServiceAccount]:
            rows = session.scalars(
                select(ServiceAccount)
                .where(ServiceAccount.project_id == grant.project.id, ServiceAccount.deleted_at.is_(None))
                .order_by(ServiceAccount.name)
            )
            return [self._view(sa, grant.project.short, self._role(session, sa)) for sa in rows]

        page = self.pager.page(await self.db.run(fetch), request)
        return api.ServiceAccountList(service_accounts=page.items, next_page_token=page.next_page_token)

    async def create(self, principal: Principal, project_id: str, body: api.ServiceAccountCreate) -> api.ServiceAccountCreated:
        grant = await self._grant(principal, project_id, Role.ADMIN, manage=True)
        name, display, role = body.name, body.display_name, body.role
        now = self.clock.now()

        def create(session: Session) -> api.ServiceAccountCreated:
            taken = session.scalar(
                select(ServiceAccount).where(ServiceAccount.project_id == grant.project.id, ServiceAccount.name == name)
            )
            if taken is not None:
                raise Conflict(f"service account name {name} is taken (names are reserved permanently, even after deletion)")
            sa = ServiceAccount(project_id=grant.project.id, name=name, display_name=display.strip(), created_at=now)
            session.add(sa)
            session.flush()
            session.add(ProjectMember(project_id=grant.project.id, service_account_id=sa.id, role=role, created_at=now))
            email = service_account_email(sa, grant.project.short)
            self.audit.record(session, grant.project.id, principal, "serviceaccount.create", email, {"role": role})
            return api.ServiceAccountCreated(
                service_account=self._view(sa, grant.project.short, role),
                note=f"create a key with POST .../service-accounts/{sa.name}/keys; it acts with the {role} role on this project's contents",
            )

        return await self.db.run(create)

    async def delete(self, principal: Principal, project_id: str, ref: str) -> api.ServiceAccountDeleted:
        grant = await self._grant(principal, project_id, Role.ADMIN, manage=True)
        now = self.clock.now()

        def delete(session: Session) -> api.ServiceAccountDeleted:
            sa = self._find(session, grant.project.id, ref)
            sa.deleted_at = now
            sa.disabled = True
            revoked = 0
            for key in session.scalars(select(ApiKey).where(ApiKey.service_account_id == sa.id, ApiKey.revoked_at.is_(None))):
                key.revoked_at = now
                revoked += 1
            for row in session.scalars(select(ProjectMember).where(ProjectMember.service_account_id == sa.id)):
                session.delete(row)
            email = service_account_email(sa, grant.project.short)
            self.audit.record(session, grant.project.id, principal, "serviceaccount.delete", email, {"keys_revoked": revoked})
            return api.ServiceAccountDeleted(
                deleted=True, service_account=email, note=f"{revoked} key(s) revoked; the name stays reserved and cannot be reused"
            )

        return await self.db.run(delete)

    async def list_keys(self, principal: Principal, project_id: str, ref: str) -> ApiKeyList:
        grant = await self._grant(principal, project_id, Role.MEMBER, manage=False)
        now = self.clock.now()

        def fetch(session: Session) -> ApiKeyList:
            sa = self._find(session, grant.project.id, ref)
            rows = session.scalars(
                select(ApiKey).where(ApiKey.service_account_id == sa.id).order_by(ApiKey.created_at.desc(), ApiKey.key_id)
            )
            return ApiKeyList(keys=[key_view(k, now) for k in rows])

        return await self.db.run(fetch)

    async def create_key(
        self, principal: Principal, project_id: str, ref: str, body: ApiKeyCreate | None = None
    ) -> ApiKeyCreated:
        grant = await self._grant(principal, project_id, Role.ADMIN, manage=True)
        now = self.clock.now()
        body = body or ApiKeyCreate()
        display_name, expires_at = body.display_name, key_expiry(body, now)

        def create(session: Session) -> ApiKeyCreated:
            # A soft-deleted account is disabled, not gone: the spec answers a key for it with 409
            # "service account disabled (a key would not authenticate)", so it is looked up here too.
            sa = self._find(session, grant.project.id, ref, include_deleted=True)
            if sa.disabled:
                raise Conflict(f"service account {sa.name} is disabled; a key would not authenticate")
            row, secret = new_key(
                session, now, kind="service_account", display_name=display_name, expires_at=expires_at,
                service_account_id=sa.id, project_id=grant.project.id,
            )
            self.audit.record(
                session, grant.project.id, principal, "serviceaccount.key.create",
                service_account_email(sa, grant.project.short), {"key_id": row.key_id},
            )
            return ApiKeyCreated(key=key_view(row, now), secret=secret, note=KEY_NOTE)

        return await self.db.run(create)

    async def revoke_key(self, principal: Principal, project_id: str, ref: str, key_ref: str) -> ApiKeyRevoked:
        grant = await self._grant(principal, project_id, Role.ADMIN, manage=True)
        now = self.clock.now()

        def revoke(session: Session) -> ApiKeyRevoked:
            sa = self._find(session, grant.project.id, ref)
            key = find_key(session, key_ref, service_account_id=sa.id)
            if key.revoked_at is None:
                key.revoked_at = now
                self.audit.record(
                    session, grant.project.id, principal, "serviceaccount.key.revoke",
                    service_account_email(sa, grant.project.short), {"key_id": key.key_id},
                )
            return ApiKeyRevoked(revoked=key.key_id, note=REVOKE_NOTE)

        return await self.db.run(revoke)

    # -- workload keys (platform-internal: no caller principal) -------------------------------------

    async def mint_workload_key(self, project_id: str, display_name: str = "workload", *, replace: bool = False) -> str:
        """A `cai_wl_...` key for a project's workloads (agents, MCP servers) to put in `CAI_PROJECT_KEY`.

        Called by the platform at deploy; the whole key is returned once and only its hash is kept. With
        `replace`, the project's earlier live keys of the same `display_name` are revoked in the same
        transaction (one live key per workload, however often it rolls out)."""
        now = self.clock.now()

        def mint(session: Session) -> str:
            if session.get(Project, project_id) is None:
                raise NotFound("not found")
            if replace:
                self._revoke_workload_keys_sync(session, project_id, display_name, now)
            _, secret = new_key(session, now, kind="workload", display_name=display_name, expires_at=None, project_id=project_id)
            return secret

        return await self.db.run(mint)

    async def revoke_workload_keys(self, project_id: str, display_name: str) -> int:
        """Revoke a project's live workload keys minted under `display_name` (e.g. when an agent goes)."""
        now = self.clock.now()
        return await self.db.run(lambda session: self._revoke_workload_keys_sync(session, project_id, display_name, now))

    @staticmethod
    def _revoke_workload_keys_sync(session: Session, project_id: str, display_name: str, now: datetime) -> int:
        rows = list(
            session.scalars(
                select(ApiKey).where(
                    ApiKey.project_id == project_id,
                    ApiKey.kind == "workload",
                    ApiKey.display_name == display_name,
                    ApiKey.revoked_at.is_(None),
                )
            )
        )
        for key in rows:
            key.revoked_at = now
        return len(rows)
