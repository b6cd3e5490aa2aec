"""The project secret store: named, versioned values, audited reveal, scoped read tokens, bindings.

Values live in a `SecretBackend` (OpenBao/Vault, or in memory) under a per-project prefix and are never
returned by a read; bindings live in the database and reach agents through the `AgentSecrets` port.

Roles (document 2): a member lists, creates, rotates, reads metadata and versions, manages bindings,
applies and mints tokens; a project admin also reveals and deletes. A workload key reaches exactly one
route: the project-wide `secrets:issue-token` of its own project.
"""

from __future__ import annotations

import builtins
import logging
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models.secrets import RESERVED_ENV_NAMES, SecretBinding
from caiplatform.domain import secrets as secret_rules
from caiplatform.domain.secrets import (  # noqa: F401  (the routes import the caps and verbs from here)
    BINDING_BODY_LIMIT,
    CREATE_BODY_LIMIT,
    MAX_VALUE_BYTES,
    NAME_MESSAGE,
    PIN_MESSAGE,
    PROJECT_SECRET_VERBS,
    RESERVED_SECRET_NAMES,
    REVEAL_NOT_AUDITED_MESSAGE,
    SECRET_MAP_VERBS,
    SECRET_NAME_REQUIRED_MESSAGE,
    SECRET_VERBS,
    TTL_MESSAGE,
    VALUE_MISSING_MESSAGE,
    VALUE_TOO_LARGE_MESSAGE,
    check_value,
    reserved_name_message,
    unknown_verb_message,
)
from caiplatform.errors import (
    BadRequest,
    Conflict,
    FailedDependency,
    NotFound,
    PlatformError,
    Unavailable,
)
from caiplatform.models import secrets as models
from caiplatform.models.base import BodyOrReader, body_after_gate
from caiplatform.pagination import Pager, page_body
from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets
from caiplatform.ports.secrets import (
    SecretBackend,
    SecretMetadata,
    SecretMissing,
    StoreHealth,
    StoreUnavailable,
    StoreUnconfigured,
    UnconfiguredSecretBackend,
    VersionDestroyed,
    VersionMissing,
)
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import Access, Role
from caiplatform.services.audit import AuditLog
from caiplatform.validation import ENV_NAME, SECRET_NAME, project_uuid

log = logging.getLogger(__name__)

RESERVED_LIST = ", ".join(RESERVED_ENV_NAMES)


def _iso(moment: datetime | None) -> str | None:
    return rfc3339(moment) if moment else None


class SecretStore:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        backend: SecretBackend | None = None,
        agents: AgentSecrets | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.backend: SecretBackend = backend or UnconfiguredSecretBackend()
        self.agents = agents

    def set_backend(self, backend: SecretBackend) -> None:
        """Attach the store once it exists (the embedded OpenBao starts with the platform)."""
        self.backend = backend

    def set_agents(self, agents: AgentSecrets) -> None:
        self.agents = agents

    async def health(self) -> StoreHealth:
        return await self.backend.health()

    # -- shared checks ----------------------------------------------------------------------------

    async def _grant(self, principal: Principal, project_id: str, need: Role) -> str:
        return (await self.access.project_ref(principal, project_id, need)).id

    check_name = staticmethod(secret_rules.check_name)
    ttl_of = staticmethod(secret_rules.ttl_of)
    pin_of = staticmethod(secret_rules.pin_of)
    _name = check_name

    async def _metadata(self, project_id: str, name: str) -> SecretMetadata:
        meta = await self.backend.metadata(project_id, name)
        if meta is None:
            raise NotFound(f"secret {name} not found")
        return meta

    def _agent_secrets(self) -> AgentSecrets:
        if self.agents is None:
            raise Unavailable("agents are not available on this platform, so bindings cannot reach them")
        return self.agents

    async def _agent(self, project_id: str, name: str) -> AgentRef:
        agent = await self._agent_secrets().find_agent(project_id, name) if isinstance(name, str) else None
        if agent is None:
            raise NotFound(f"unknown agent: {name}")
        return agent

    def _audit(self, project_id: str, principal: Principal | None, action: str, target: str, detail: Any = None) -> Any:
        return self.db.run(lambda s: self.audit.record(s, project_id, principal, action, target, detail))

    # -- secrets ------------------------------------------------------------------------------------

    async def list(
        self, principal: Principal, project_id: str, page_size: Any = None, page_token: str | None = None
    ) -> models.SecretList:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        request = self.pager.request(f"secrets:{pid}", page_size, page_token)
        items = [
            {
                "name": m.name,
                "current_version": m.current_version,
                "created_at": _iso(m.created_at),
                "updated_at": _iso(m.updated_at),
            }
            for m in await self.backend.list(pid)
            if m.name not in RESERVED_SECRET_NAMES
        ]
        page = self.pager.page(items, request)
        return models.SecretList.of(page_body("secrets", page, path_prefix=self.backend.path_prefix(pid)))

    async def put(self, principal: Principal, project_id: str,
                  body: BodyOrReader[models.SecretWrite]) -> models.SecretWritten:
        """Create a secret or store its next version: `created` is true (201) for a first version, false
        (200) for a rotation."""
        pid = await self._grant(principal, project_id, Role.MEMBER)
        body = await body_after_gate(body)
        name, value = body.name, body.value
        version = await self.backend.write(pid, name, value)
        created = version == 1
        await self._audit(pid, principal, "project.secret.write", name, {"version": version, "created": created})
        note = (
            f"created {name} with version 1"
            if created
            else f"stored version {version} of {name}; agents tracking the newest version receive it on their "
            "next apply or deploy"
        )
        note += "; the value is never returned by reads (a project admin can reveal it)"
        return models.SecretWritten(name=name, version=version, created=created, note=note)

    def _used_by_sync(self, session: Session, project_id: str, name: str) -> builtins.list[dict[str, Any]]:
        rows = session.scalars(
            select(SecretBinding)
            .where(SecretBinding.project_id == project_id, SecretBinding.secret_name == name)
            .order_by(SecretBinding.agent_slug, SecretBinding.env_name)
        )
        out = []
        for row in rows:
            item: dict[str, Any] = {
                "id": row.id,
                "agent_id": row.agent_id,
                "agent_slug": row.agent_slug,
                "env_name": row.env_name,
            }
            if row.version is not None:
                item["version"] = row.version
            item["created_at"] = _iso(row.created_at)
            item["updated_at"] = _iso(row.updated_at)
            out.append(item)
        return out

    @staticmethod
    def _versions(meta: SecretMetadata) -> builtins.list[dict[str, Any]]:
        return [
            {"version": v.version, "created_at": _iso(v.created_at), "destroyed": v.destroyed} for v in meta.versions
        ]

    async def get(self, principal: Principal, project_id: str, name: str) -> models.Secret:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        name = self._name(name)
        meta = await self._metadata(pid, name)
        body: dict[str, Any] = {
            "name": meta.name,
            "current_version": meta.current_version,
            "created_at": _iso(meta.created_at),
            "updated_at": _iso(meta.updated_at),
            "versions": self._versions(meta),
        }
        used_by = await self.db.run(lambda s: self._used_by_sync(s, pid, name))
        if used_by:
            body["used_by"] = used_by
        return models.Secret.of(body)

    async def versions(self, principal: Principal, project_id: str, name: str) -> models.SecretVersions:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        name = self._name(name)
        meta = await self._metadata(pid, name)
        return models.SecretVersions.of(
            {"name": meta.name, "current_version": meta.current_version, "versions": self._versions(meta)})

    async def delete(self, principal: Principal, project_id: str, name: str) -> models.SecretDeleted:
        pid = await self._grant(principal, project_id, Role.ADMIN)
        name = self._name(name)
        bound = await self.db.run(lambda s: self._used_by_sync(s, pid, name))
        if bound:
            listed = ", ".join(f"{b['agent_slug']}/{b['env_name']}" for b in bound)
            raise Conflict(
                f"{name} is still bound by {len(bound)} binding(s): {listed}; delete those bindings first"
            )
        meta = await self._metadata(pid, name)
        await self.backend.destroy(pid, name)
        await self._audit(pid, principal, "project.secret.delete", name, {"versions": meta.current_version})
        return models.SecretDeleted(
            name=name, deleted=True,
            note=f"destroyed all {meta.current_version} version(s) of {name}; this cannot be undone",
        )

    async def reveal(
        self, principal: Principal, project_id: str, name: str, body: models.SecretReveal | None = None
    ) -> models.SecretRevealResult:
        """Project admin only; fail-closed: no audit row, no value. Version 0 (or no body): the current one."""
        pid = await self._grant(principal, project_id, Role.ADMIN)
        name = self._name(name)
        body = body or models.SecretReveal()
        version, reason = body.version, body.reason
        try:
            secret = await self.backend.read(pid, name, version or None)
        except SecretMissing:
            raise NotFound(f"secret {name} not found") from None
        except (VersionMissing, VersionDestroyed) as exc:
            raise BadRequest(_version_message(exc)) from None
        detail = {"version": secret.version, "reason": reason}
        try:
            await self.db.run(
                lambda s: self.audit.record_strict(s, pid, principal, "project.secret.reveal", name, detail)
            )
        except Exception:  # noqa: BLE001 - any audit failure withholds the value
            log.exception("reveal of %s in project %s refused: audit write failed", name, pid)
            raise Unavailable(REVEAL_NOT_AUDITED_MESSAGE) from None
        return models.SecretRevealResult(
            name=name, version=secret.version, value=secret.value,
            note="this reveal was recorded in the project audit log",
        )

    # -- read tokens ----------------------------------------------------------------------------

    def _token_body(self, token: Any) -> models.SecretIssueTokenResult:
        return models.SecretIssueTokenResult.of({
            "token": token.token,
            "ttl_seconds": token.ttl_seconds,
            "read": {"addr": token.addr, "path": token.path},
            "note": "present the token directly to the secret store (header X-Vault-Token); it reads only and "
            f"expires in {token.ttl_seconds} s",
        })

    async def issue_token(
        self, principal: Principal, project_id: str, name: str, body: models.SecretIssueToken | None = None
    ) -> models.SecretIssueTokenResult:
        """A read token for one secret: members only (a workload key gets 404)."""
        if principal.kind is PrincipalKind.WORKLOAD:
            raise NotFound("not found")
        pid = await self._grant(principal, project_id, Role.MEMBER)
        name = self._name(name)
        ttl = (body or models.SecretIssueToken()).ttl_seconds
        await self._metadata(pid, name)
        token = await self.backend.mint_read_token(pid, name, ttl)
        await self._audit(pid, principal, "project.secret.issue-token", name, {"ttl_seconds": token.ttl_seconds})
        return self._token_body(token)

    async def issue_project_token(
        self, principal: Principal, project_id: str, body: models.SecretIssueToken | None = None
    ) -> models.SecretIssueTokenResult:
        """A read token for every secret of the project: members, or the project's own workload key."""
        if principal.kind is PrincipalKind.WORKLOAD:
            self.access.require_management(principal, allow_workload=True)
            pid = project_uuid(project_id)
            if principal.project_id != pid:
                raise NotFound("not found")
        else:
            pid = await self._grant(principal, project_id, Role.MEMBER)
        ttl = (body or models.SecretIssueToken()).ttl_seconds
        token = await self.backend.mint_read_token(pid, None, ttl)
        await self._audit(pid, principal, "project.secret.issue-token", "*", {"ttl_seconds": token.ttl_seconds})
        return self._token_body(token)

    # -- bindings -------------------------------------------------------------------------------

    @staticmethod
    def _binding_body(row: SecretBinding) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": row.id,
            "agent_id": row.agent_id,
            "agent_slug": row.agent_slug,
            "env_name": row.env_name,
            "secret_name": row.secret_name,
            "pinned_to": "latest" if row.version is None else str(row.version),
        }
        if row.version is not None:
            body["version"] = row.version
        body["created_at"] = _iso(row.created_at)
        body["updated_at"] = _iso(row.updated_at)
        return body

    async def list_bindings(
        self, principal: Principal, project_id: str, page_size: Any = None, page_token: str | None = None
    ) -> models.BindingList:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        request = self.pager.request(f"secret-maps:{pid}", page_size, page_token)

        def fetch(session: Session) -> builtins.list[dict[str, Any]]:
            rows = session.scalars(
                select(SecretBinding)
                .where(SecretBinding.project_id == pid)
                .order_by(SecretBinding.agent_slug, SecretBinding.env_name)
                .offset(request.offset)
                .limit(request.size + 1)
            )
            return [self._binding_body(r) for r in rows]

        page = self.pager.page_from_probe(await self.db.run(fetch), request)
        return models.BindingList.of(page_body("bindings", page))

    def _agent_bindings_sync(self, session: Session, agent: AgentRef) -> builtins.list[SecretBinding]:
        return list(
            session.scalars(
                select(SecretBinding).where(SecretBinding.agent_id == agent.id).order_by(SecretBinding.env_name)
            )
        )

    async def agent_bindings(self, principal: Principal, project_id: str, agent_name: str) -> models.AgentBindings:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        agent = await self._agent(pid, agent_name)
        rows = await self.db.run(lambda s: self._agent_bindings_sync(s, agent))
        return models.AgentBindings.of({"agent": agent.name, "bindings": [self._binding_body(r) for r in rows]})

    @staticmethod
    def _env_name(raw: Any) -> str:
        if not isinstance(raw, str) or not ENV_NAME.match(raw):
            raise BadRequest(
                f"invalid env name {raw!s}: must match ^[A-Za-z_][A-Za-z0-9_]*$ and must not be one of the "
                f"reserved names ({RESERVED_LIST})"
            )
        if raw in RESERVED_ENV_NAMES:
            raise BadRequest(
                f"{raw} is a reserved environment name and cannot be bound; reserved names: {RESERVED_LIST}"
            )
        return raw

    async def bind(
        self, principal: Principal, project_id: str, agent_name: str, env_name: str,
        body: BodyOrReader[models.BindingPut],
    ) -> models.BindingSaved:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        body = await body_after_gate(body)
        agent = await self._agent(pid, agent_name)
        # (1) env name pattern, not reserved
        env = self._env_name(env_name)
        secret_name, version = body.secret_name, body.version
        # (2) the secret exists in the project
        meta = None
        if SECRET_NAME.match(secret_name) and secret_name not in RESERVED_SECRET_NAMES:
            meta = await self.backend.metadata(pid, secret_name)
        if meta is None:
            raise BadRequest(f"secret {secret_name} does not exist in this project")
        if version is not None:
            info = meta.version(version)
            # (3) a pinned version exists
            if info is None:
                raise BadRequest(f"{secret_name} has no version {version} (current is {meta.current_version})")
            # (4) ... and is not destroyed
            if info.destroyed:
                raise BadRequest(f"version {version} of {secret_name} is destroyed and cannot be bound")
        now = self.clock.now()

        def save(session: Session) -> dict[str, Any]:
            row = session.scalar(
                select(SecretBinding).where(SecretBinding.agent_id == agent.id, SecretBinding.env_name == env)
            )
            if row is None:
                row = SecretBinding(
                    project_id=pid, agent_id=agent.id, agent_slug=agent.name, env_name=env, created_at=now
                )
                session.add(row)
            row.agent_slug = agent.name
            row.secret_name = secret_name
            row.version = version
            row.updated_at = now
            session.flush()
            target = f"{agent.name}/{env}"
            self.audit.record(
                session, pid, principal, "project.secret.bind", target,
                {"secret": secret_name, "pinned_to": "latest" if version is None else str(version)},
            )
            return self._binding_body(row)

        binding = await self.db.run(save)
        return models.BindingSaved.of({
            "binding": binding,
            "note": f"{secret_name} will arrive as {env} on {agent.name} at its next apply or deploy "
            "(POST .../secret-maps:apply delivers it now)",
        })

    async def unbind(self, principal: Principal, project_id: str, agent_name: str, env_name: str) -> models.BindingRemoved:
        """Immediate revocation; never touches the secret store, so it works while the store is sealed."""
        pid = await self._grant(principal, project_id, Role.MEMBER)
        agent = await self._agent(pid, agent_name)

        def remove(session: Session) -> str | None:
            row = session.scalar(
                select(SecretBinding).where(SecretBinding.agent_id == agent.id, SecretBinding.env_name == env_name)
            )
            if row is None:
                return None
            secret_name = row.secret_name
            session.delete(row)
            return secret_name

        secret_name = await self.db.run(remove)
        if secret_name is None:
            raise NotFound(f"no binding for {env_name} on agent {agent.name}")
        agents = self._agent_secrets()
        revoked = True
        try:
            await agents.remove_keys(agent, [env_name])
        except Exception:  # noqa: BLE001 - reported as revoked: false
            log.exception("unbind %s/%s: removing the key from the agent's secret failed", agent.name, env_name)
            revoked = False
        rolled = False
        if revoked:
            try:
                rolled = await agents.roll_revision(agent, f"unbind {env_name}")
            except Exception:  # noqa: BLE001 - reported as revision_rolled: false
                log.exception("unbind %s/%s: rolling a revision failed", agent.name, env_name)
        await self._audit(
            pid, principal, "project.secret.unbind", f"{agent.name}/{env_name}",
            {"secret": secret_name, "revoked": revoked, "revision_rolled": rolled},
        )
        if revoked:
            note = f"{env_name} was removed from {agent.name}'s secret" + (
                " and a new revision is rolling out" if rolled else "; no revision was rolled (nothing is deployed)"
            )
        else:
            note = (
                f"the binding was deleted but {env_name} could not be removed from {agent.name}'s running secret: "
                f"treat the credential in {secret_name} as exposed and rotate it"
            )
        return models.BindingRemoved(
            agent=agent.name, env_name=env_name, deleted=True, revoked=revoked, revision_rolled=rolled, note=note,
        )

    async def apply(self, principal: Principal, project_id: str, agent_name: str) -> models.BindingsApplied:
        pid = await self._grant(principal, project_id, Role.MEMBER)
        agent = await self._agent(pid, agent_name)
        rows = await self.db.run(lambda s: self._agent_bindings_sync(s, agent))
        if not rows:
            return models.BindingsApplied(
                agent=agent.name, applied=[], revision_rolled=False,
                note=f"{agent.name} has no bindings; nothing changed",
            )
        values, results = await self._read_bound(principal, pid, agent, rows)
        await self._agent_secrets().set_keys(agent, values)
        for item in results:
            item["applied"] = True
        rolled = await self._agent_secrets().roll_revision(agent, "apply secret bindings")
        return models.BindingsApplied.of({
            "agent": agent.name,
            "applied": results,
            "revision_rolled": rolled,
            "note": f"wrote {len(values)} bound value(s) into {agent.name}'s secret"
            + ("; a new revision is rolling out" if rolled else "; they take effect at the next deploy"),
        })

    async def _read_bound(
        self, principal: Principal | None, pid: str, agent: AgentRef, rows: builtins.list[SecretBinding]
    ) -> tuple[dict[str, str], builtins.list[dict[str, Any]]]:
        """Read every bound value (each read audited); 424 with the per-binding list if any read fails."""
        values: dict[str, str] = {}
        results: builtins.list[dict[str, Any]] = []
        failed = 0
        for row in rows:
            item: dict[str, Any] = {"env_name": row.env_name, "secret_name": row.secret_name, "version": row.version}
            try:
                secret = await self.backend.read(pid, row.secret_name, row.version)
            except PlatformError as exc:
                failed += 1
                item["error"] = _read_error(exc, row.secret_name)
            else:
                item["version"] = secret.version
                values[row.env_name] = secret.value
            results.append(item)
            await self._audit(
                pid, principal, "project.secret.apply", f"{agent.name}/{row.env_name}",
                {"secret": row.secret_name, "version": item["version"], "read": "error" not in item},
            )
        if failed:
            for item in results:
                item["applied"] = False
            raise FailedDependency(
                f"apply to {agent.name} failed: {failed} of {len(rows)} bound value(s) could not be read; "
                "nothing was written",
                body={"agent": agent.name, "applied": results},
            )
        return values, results

    async def values_for_deploy(self, principal: Principal | None, agent: AgentRef) -> dict[str, str]:
        """The bound values an agent's deploy puts into its secret (for the agents area).

        Same reads and audit as `apply`; raises the same 424 when a value cannot be read. An agent without
        bindings gets `{}` without touching the store.
        """
        rows = await self.db.run(lambda s: self._agent_bindings_sync(s, agent))
        if not rows:
            return {}
        values, _ = await self._read_bound(principal, agent.project_id, agent, rows)
        return values

    async def purge_project(self, project_id: str) -> int:
        """Destroy every secret and binding of a project being deleted (called by the projects area).

        Needs the store; returns how many secrets were destroyed.
        """
        names = [m.name for m in await self.backend.list(project_id)]
        for name in names:
            await self.backend.destroy(project_id, name)
        await self.db.run(
            lambda s: s.execute(delete(SecretBinding).where(SecretBinding.project_id == project_id))
        )
        return len(names)

    async def forget_agent(self, agent_id: str) -> int:
        """Drop every binding of a deleted agent (called by the agents area); returns how many."""

        def run(session: Session) -> int:
            # a DML statement's result is a CursorResult (Session.execute is typed for any statement)
            result = cast(CursorResult[Any], session.execute(delete(SecretBinding).where(SecretBinding.agent_id == agent_id)))
            return int(result.rowcount or 0)

        return await self.db.run(run)


def _version_message(exc: VersionMissing | VersionDestroyed) -> str:
    if isinstance(exc, VersionMissing):
        return str(exc)
    return f"version {exc.version} of {exc.name} is destroyed and cannot be read"


def _read_error(exc: PlatformError, name: str) -> str:
    if isinstance(exc, SecretMissing):
        return f"secret {name} does not exist any more"
    if isinstance(exc, VersionMissing | VersionDestroyed):
        return _version_message(exc)
    if isinstance(exc, StoreUnconfigured | StoreUnavailable):
        return exc.message
    return exc.message
