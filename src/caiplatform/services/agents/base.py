"""The agents service's base: construction, background tasks, resolving a name to an agent (the owner
gate of every management route), the agent view.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from caiplatform import validation
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import Project
from caiplatform.db.models.agents import Agent
from caiplatform.db.prefetch import Prefetched, Then
from caiplatform.errors import Conflict, Forbidden, NotFound
from caiplatform.metrics import Metrics
from caiplatform.models.agents import AgentView
from caiplatform.pagination import Pager
from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets
from caiplatform.ports.builder import Builder
from caiplatform.ports.runtime import (
    WorkloadRef,
    WorkloadRuntime,
    WorkloadStatus,
)
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.routing import HostRouter
from caiplatform.services.access import Access, ProjectGrant, ProjectRef
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.services.agents.lookup import AgentRow, visible_candidates
from caiplatform.services.agents.records import (
    MODEL_FRAMEWORKS,
    NO_MODEL_ENDPOINT_NOTE,
    AgentRecord,
    owner_ref_of,
    unknown_agent,
)
from caiplatform.services.audit import AuditLog
from caiplatform.services.service_quota import ServiceQuota
from caiplatform.settings import Settings
from caiplatform.worklocks import LocalWorkLocks

log = logging.getLogger(__name__)
A = TypeVar("A", Agent, AgentRow)
# The question the owner gate's prefetched read answers (with the agent's name).
GATE = "agents.owner-gate"
P = TypeVar("P", Project, ProjectRef)
T = TypeVar("T")


class AgentBase:
    """The agents service's ground floor: its collaborators, background tasks, the owner gate that
    resolves a name to an agent, and the agent view."""


    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        settings: Settings,
        builder: Builder,
        runtime: WorkloadRuntime,
        hosts: HostRouter,
        *,
        mode: str = "memory",
        bound_values: Callable[[Principal | None, AgentRef], Any] | None = None,
        forget_bindings: Callable[[str], Any] | None = None,
        forget_memory: Callable[[InvokeTarget], Any] | None = None,
        public_upstream: Callable[[InvokeTarget], Any] | None = None,
        authenticate: Callable[[str], Awaitable[Principal]] | None = None,
        quota: ServiceQuota | None = None,
        session_access: Any = None,
        metrics: Metrics | None = None,
        secret_tables: Callable[[Database, Callable[[str, str], Awaitable[bool]]], AgentSecrets] | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.settings = settings
        self.builder = builder
        self.runtime = runtime
        self.hosts = hosts
        self.mode = mode
        # Hooks into the secrets area: bound values at deploy, forget bindings at delete.
        self.bound_values = bound_values
        self.forget_bindings = forget_bindings
        # Hooks into the invoke area: drop the long-term memory at delete; serve the published host.
        self.forget_memory = forget_memory
        self.public_upstream = public_upstream
        # How a published `apikey` address checks the key it is shown (the platform's own keys).
        self.authenticate = authenticate
        # Server mode: each agent's own Valkey user for its sessions (`adapters/redis/session_access.py`);
        # None: sessions are in a file of the agent's own, or in memory.
        self.session_access = session_access
        # The agent-secret port on this service's tables, given the database and this service's rollout
        # (`adapters/tables/agent_secrets.py`, which the platform passes): bindings write into it and roll.
        self.secret_tables = secret_tables
        # cai_builds_total and cai_build_duration_seconds (the platform's registry; a private one alone).
        self.prometheus = metrics or Metrics()
        self._tasks: dict[str, set[asyncio.Task[Any]]] = {}
        self._roll_locks: dict[str, asyncio.Lock] = {}
        # The project services quota, shared with the serverless area (the platform passes one object).
        self.quota = quota if quota is not None else ServiceQuota(runtime.usage)
        # A build runs under its work lock; replaced by the platform with locks in its database, so a
        # build whose replica died (lock free, agent still `building`) is taken over by another.
        self.locks: Any = LocalWorkLocks()
        self._takeover: asyncio.Task[None] | None = None

    def _spawn(self, agent_id: str, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        group = self._tasks.setdefault(agent_id, set())
        group.add(task)
        task.add_done_callback(group.discard)

    async def _cancel_tasks(self, agent_id: str) -> None:
        current = asyncio.current_task()
        tasks = [t for t in self._tasks.pop(agent_id, set()) if t is not current]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def wait_idle(self, name: str | None = None) -> None:
        """Wait for background builds and rollouts (tests and the CLI)."""
        while True:
            pending = [t for group in self._tasks.values() for t in group if not t.done()]
            if not pending:
                return
            await asyncio.gather(*pending, return_exceptions=True)

    # == project and agent resolution ===============================================================

    def _projects_sync(self, session: Session, principal: Principal, project: str | None) -> list[ProjectGrant]:
        """Visible projects, narrowed by `?project=<slug|short|id>` (no grant there: 404)."""
        if project:
            grants = [self.access.grant_sync(session, principal, p) for p in self.access.project_by_ref_sync(session, project)]
            grants = [g for g in grants if g.visible]
            if not grants:
                raise NotFound("not found")
            return grants
        grants = self.access.visible_projects_sync(session, principal)
        if principal.kind is PrincipalKind.SERVICE_ACCOUNT:
            grants = [g for g in grants if g.project.id == principal.project_id]
        return grants

    def _candidates_sync(self, session: Session, grants: list[ProjectGrant], name: str) -> list[tuple[Agent, Project, ProjectGrant]]:
        by_id = {g.project.id: g for g in grants}
        if not by_id:
            return []
        rows = session.execute(
            select(Agent, Project).join(Project, Project.id == Agent.project_id)
            .where(Agent.name == name, Agent.project_id.in_(list(by_id)))
        ).all()
        return [(a, p, by_id[p.id]) for a, p in rows]

    @staticmethod
    def _manages_all(principal: Principal, grant: ProjectGrant) -> bool:
        return principal.kind in (PrincipalKind.AUTOMATION, PrincipalKind.INTERNAL) or grant.resource_role == "admin"

    def _owner_gate(self, principal: Principal, grant: ProjectGrant, agent: Agent | AgentRow) -> None:
        if self._manages_all(principal, grant):
            return
        if grant.resource_role is None:
            raise NotFound(unknown_agent(agent.name))
        if agent.owner_ref is None:
            raise Forbidden(
                f"agent {agent.name} has no recorded owner: only a project admin can redeploy or manage it"
            )
        if agent.owner_ref != owner_ref_of(principal):
            raise NotFound(unknown_agent(agent.name))

    def _locate_sync(self, session: Session, principal: Principal, name: str,
                     project: str | None) -> tuple[Agent | AgentRow, Project | ProjectRef, ProjectGrant]:
        """The owner gate of every management route, in a unit of work: the agents named `name` in the
        projects the caller sees (narrowed by `?project=`; without it the one-statement read of `lookup`,
        on the session's connection), then the one the caller may manage."""
        validation.agent_name(name)  # 400 `invalid agent name (must be a lowercase DNS label)`
        if project:
            return self._choose(principal, name,
                                self._candidates_sync(session, self._projects_sync(session, principal, project), name))
        return self._choose(principal, name,
                            visible_candidates(session.connection(), self.access, principal, name, self.clock.now()))

    def _choose(self, principal: Principal, name: str, found: list[tuple[A, P, ProjectGrant]]) -> tuple[A, P, ProjectGrant]:
        """The one candidate the caller may manage, or the refusal the owner gate owes."""
        if not found:
            raise NotFound(unknown_agent(name))
        if len(found) > 1:
            # Someone else's agent looks like a missing one: only the ones this caller may manage count.
            allowed, refusals = [], []
            for candidate in found:
                try:
                    self._owner_gate(principal, candidate[2], candidate[0])  # type: ignore[arg-type]
                    allowed.append(candidate)
                except (NotFound, Forbidden) as exc:
                    refusals.append(exc)
            if len(allowed) > 1:
                raise Conflict(
                    f"agent {name} exists in several projects ({', '.join(sorted(p.slug for _, p, _ in allowed))}); "  # type: ignore[attr-defined]
                    "add ?project=<slug> to choose one"
                )
            if not allowed:
                raise next((e for e in refusals if isinstance(e, Forbidden)), refusals[0])
            return allowed[0]
        agent, proj, grant = found[0]
        self._owner_gate(principal, grant, agent)  # type: ignore[arg-type]
        return agent, proj, grant

    def gate_read(self, name: str, project: str | None) -> Then | None:
        """The owner gate's read of `_locate`, to make in the credential's thread job instead of a second
        one (`caiplatform.db.prefetch`); only for the one-statement read (no `?project=`, a valid name)."""
        if project is not None or not isinstance(name, str) or not validation.AGENT_NAME.match(name):
            return None

        def read(connection: Connection, principal: Principal) -> Any:
            return visible_candidates(connection, self.access, principal, name, self.clock.now())

        return Then((GATE, name), read)

    async def gate(self, principal: Principal, name: str | None, project: str | None) -> None:
        """The caller's checks of an agent route and nothing else: the owner gate of `name` (its 401, 403 or
        404), or with no name the `?project=` the route would deploy into. For a request refused for its
        shape before its service looked at the caller (`caiplatform_server.checks_first`)."""
        if name is not None:
            await self._locate(principal, name, project)
            return
        self.access.require_management(principal)
        if project:
            await self.db.read_session(lambda s: self._projects_sync(s, principal, project))

    async def _locate(self, principal: Principal, name: str, project: str | None,
                      prefetched: Prefetched | None = None) -> AgentRecord:
        self.access.require_management(principal)
        if project is None:
            # The whole gate in one Core statement (`lookup`), on the read path.
            validation.agent_name(name)
            if prefetched is not None and prefetched.answers((GATE, name), principal):
                found = prefetched.result()  # read for this request, with its credential
            else:
                now = self.clock.now()
                found = await self.db.read(lambda c: visible_candidates(c, self.access, principal, name, now))
            agent, ref, _ = self._choose(principal, name, found)
            return AgentRecord.of(agent, ref)

        def run(session: Session) -> AgentRecord:
            agent, proj, _ = self._locate_sync(session, principal, name, project)
            return AgentRecord.of(agent, proj)

        return await self.db.read_session(run)  # a read-only gate: no transaction to commit

    async def _record_by_id(self, agent_id: str) -> AgentRecord | None:
        def run(session: Session) -> AgentRecord | None:
            agent = session.get(Agent, agent_id)
            if agent is None:
                return None
            project = session.get(Project, agent.project_id)
            if project is None:
                return None
            return AgentRecord.of(agent, project)

        return await self.db.run(run)

    @staticmethod
    def _project_sync(session: Session, project_id: str) -> Project:
        project = session.get(Project, project_id)
        if project is None:
            raise NotFound("not found")
        return project

    @staticmethod
    def _agent_sync(session: Session, record: AgentRecord) -> Agent:
        agent = session.get(Agent, record.id)
        if agent is None:
            raise NotFound(unknown_agent(record.name))
        return agent

    def _deploy_project_sync(self, session: Session, principal: Principal, name: str, project: str | None) -> ProjectGrant:
        grants = self._projects_sync(session, principal, project)
        if project:
            return grants[0]
        existing = self._candidates_sync(session, grants, name)
        if len(existing) > 1:
            raise Conflict(
                f"agent {name} exists in several projects ({', '.join(sorted(p.slug for _, p, _ in existing))}); "
                "add ?project=<slug> to choose one"
            )
        if existing:
            return existing[0][2]
        writable = [g for g in grants if g.resource_role is not None]
        if len(writable) == 1:
            return writable[0]
        raise Conflict("request resolved to no project: add ?project=<slug> or use a project-scoped credential")

    # == views ======================================================================================

    def _internal_url(self, record: AgentRecord, address: str | None) -> str:
        return address or f"http://{record.name}.{record.project.namespace}.svc.cluster.local"

    async def _ask_runtime(self, record: AgentRecord,
                           question: Callable[[WorkloadRef], Awaitable[T | None]]) -> T | None:
        try:
            return await question(record.workload)
        except Exception:  # noqa: BLE001 - a view must not fail because the runtime hiccuped
            log.exception("runtime status of %s failed", record.name)
            return None

    async def _status(self, record: AgentRecord) -> WorkloadStatus | None:
        return await self._ask_runtime(record, self.runtime.status)

    async def _address(self, record: AgentRecord) -> str | None:
        return await self._ask_runtime(record, self.runtime.address)

    async def view(self, record: AgentRecord, status: WorkloadStatus | None = None) -> AgentView:
        # The view shows only the runtime's address: without a status at hand, ask for just that.
        address = status.url if status is not None else await self._address(record)
        body: dict[str, Any] = {
            "name": record.name,
            "state": record.state,
            "status": record.state,
            "ready": record.state == "ready",
            "kind": record.kind,
            "framework": record.framework,
        }
        if record.kind == "function":
            body["runtime"] = record.runtime or "python"
        body.update({
            "image": record.image,
            "url": self._internal_url(record, address),
            "public_url": self.hosts.public_url(record.name, record.project.short),
            "latest_revision": record.latest_revision,
            "owner": record.owner_email,
            "project": record.project.slug,
            "project_id": record.project.id,
            "created_at": rfc3339(record.created_at),
            "updated_at": rfc3339(record.updated_at),
        })
        if record.external_url:
            body["external_url"] = record.external_url
        if record.message:
            body["message"] = record.message
        elif self._lacks_model_endpoint(record.framework, record.env):
            body["message"] = NO_MODEL_ENDPOINT_NOTE  # ready or not, it cannot answer: say so instead of looking fine
        # Strings from the agent's row (normalized by `AgentRecord`) and the service's own: no validation.
        return AgentView.trusted(**body)

    def _lacks_model_endpoint(self, framework: str, env: dict[str, Any] | None) -> bool:
        return framework in MODEL_FRAMEWORKS and not self.settings.model_base_url and not (env or {}).get("MODEL_BASE_URL")

    # == invoke targets ===============================================================================

    @staticmethod
    def _target_of(record: AgentRecord) -> InvokeTarget:
        return InvokeTarget(
            agent=record.name, agent_id=record.id, project_id=record.project.id, project_short=record.project.short,
            kind=record.kind, framework=record.framework, workload=record.workload,
        )

    def _target(self, agent: Agent | AgentRow, project: Project | ProjectRef) -> InvokeTarget:
        return InvokeTarget(
            agent=agent.name, agent_id=agent.id, project_id=project.id, project_short=project.short,
            kind=agent.kind, framework=agent.framework,
            workload=WorkloadRef(project.id, project.short, agent.name, agent.kind),
        )
