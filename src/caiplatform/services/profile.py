"""The caller's profile view and the platform-wide default model key; the cache ACL backfill.

The platform model key is the `MODEL_API_KEY` every agent gets unless it has its own secret of that
name. It is kept in `platform_settings` (the secret store may be sealed or absent on one machine, and
deploys must still get a key); the agents area reads it with `model_key()` at each cold start.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db import Database
from caiplatform.db.models import PlatformSetting, Project
from caiplatform.domain.identity import MODEL_KEY_SETTING
from caiplatform.models.accounts import CacheAclBackfill, ModelKeySet, Profile
from caiplatform.ports.projects import ProjectProvisioner
from caiplatform.principal import Principal
from caiplatform.services.access import Access
from caiplatform.services.audit import AuditLog
from caiplatform.services.projects import ProjectService

MODEL_KEY_SECRET = "cai-platform-model-key"
MODEL_KEY_NAMESPACE = "cai-agents"


class ProfileService:
    def __init__(self, db: Database, access: Access, audit: AuditLog, provisioner: ProjectProvisioner):
        self.db = db
        self.access = access
        self.audit = audit
        self.provisioner = provisioner
        # Called after the key changes, with the new key (None: removed); returns namespaces that missed
        # the resync. The agents area registers it; rotation lands at each agent's next cold start anyway.
        self.on_model_key_change: Callable[[str | None], Awaitable[list[str]]] | None = None

    def model_key_sync(self, session: Session) -> str | None:
        row = session.get(PlatformSetting, MODEL_KEY_SETTING)
        return self.db.open_secret(row.value) if row is not None and row.value else None

    async def model_key(self) -> str | None:
        """The platform-wide default model key, for deploys (platform-internal, no principal)."""
        return await self.db.run(self.model_key_sync)

    def _view(self, configured: bool) -> dict[str, Any]:
        return {
            "model_key_configured": configured,
            "secret": MODEL_KEY_SECRET,
            "namespace": MODEL_KEY_NAMESPACE,
            "scope": "platform",
        }

    async def profile(self, principal: Principal) -> Profile:
        self.access.require_management(principal)
        return Profile.of(self._view(await self.model_key() is not None))

    async def _resync(self, key: str | None, body: dict[str, Any]) -> Profile:
        if self.on_model_key_change is not None:
            try:
                missed = await self.on_model_key_change(key)
            except Exception as exc:  # noqa: BLE001 - the key is stored; agents pick it up on cold start
                body["warning"] = f"could not resync running agents: {exc}"
            else:
                if missed:
                    body["warning"] = "these namespaces missed the resync: " + ", ".join(missed)
        return Profile.of(body)

    async def set_model_key(self, principal: Principal, body: ModelKeySet) -> Profile:
        await self.access.require_platform_admin(principal)
        key = body.api_key

        def save(session: Session) -> None:
            row = session.get(PlatformSetting, MODEL_KEY_SETTING)
            sealed = self.db.seal_secret(key)  # at rest like agents' secrets (caiplatform.secret_box)
            if row is None:
                session.add(PlatformSetting(key=MODEL_KEY_SETTING, value=sealed))
            else:
                row.value = sealed

        await self.db.run(save)
        body_out = {
            **self._view(True),
            "note": "rotation lands at each agent's next cold start; a per-agent MODEL_API_KEY secret overrides it",
        }
        return await self._resync(key, body_out)

    async def delete_model_key(self, principal: Principal) -> Profile:
        await self.access.require_platform_admin(principal)

        def remove(session: Session) -> None:
            row = session.get(PlatformSetting, MODEL_KEY_SETTING)
            if row is not None:
                session.delete(row)

        await self.db.run(remove)
        body_out = {**self._view(False), "note": "removed; agents without their own MODEL_API_KEY lose model access at the next cold start"}
        return await self._resync(None, body_out)

    async def backfill_cache_acl(self, principal: Principal) -> CacheAclBackfill:
        """Re-run the cache-access-user provisioning step for every project (operator repair)."""
        await self.access.require_platform_admin(principal)
        projects = await self.db.run(lambda s: list(s.scalars(select(Project).order_by(Project.slug))))
        done: list[str] = []
        failed: dict[str, str] = {}
        for project in projects:
            try:
                await self.provisioner.cache_access_user(ProjectService.spec(project))
            except Exception as exc:  # noqa: BLE001 - one project's failure does not stop the others
                failed[project.slug] = str(exc) or type(exc).__name__
            else:
                done.append(project.slug)
        await self.db.run(
            lambda s: self.audit.record(s, None, principal, "valkey-acl.backfill", "", {"projects": len(done), "failed": len(failed)})
        )
        return CacheAclBackfill(
            projects=len(projects),
            backfilled=done,
            failed=failed,
            note="every project's cache access user exists now" if not failed else "some projects failed; see failed",
        )
