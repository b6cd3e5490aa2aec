"""The agents service: list, get, delete, the hooks of other areas and the invoke path's targets.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from caiplatform import validation
from caiplatform.db.models import ApiKey, Project
from caiplatform.db.models.agents import Agent, AgentBuild, AgentFile, AgentRevision, AgentSecret
from caiplatform.db.prefetch import Prefetched
from caiplatform.errors import Conflict, NotFound
from caiplatform.models.agents import AgentDeleted, AgentList, AgentView
from caiplatform.principal import Principal
from caiplatform.services.access import ProjectRef
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.services.agents.base import GATE
from caiplatform.services.agents.configuration import AgentConfiguration
from caiplatform.services.agents.lookup import AgentRow, named_agents, visible_candidates
from caiplatform.services.agents.records import (
    AgentRecord,
    owner_ref_of,
    unknown_agent,
)

log = logging.getLogger(__name__)


class AgentService(AgentConfiguration):
    """Agents and functions (document 1). The layers below hold one concern each (base, publishing,
    rollout, builds, configuration); this one lists, reads and deletes agents and resolves invoke targets."""

    # == list, get, delete ===========================================================================

    async def list(self, principal: Principal, project: str | None, page_size: int | str | None = None,
                   page_token: str | None = None) -> AgentList:
        self.access.require_management(principal)

        def run(session: Session) -> list[AgentRecord]:
            grants = self._projects_sync(session, principal, project)
            by_id = {g.project.id: g for g in grants}
            if not by_id:
                return []
            rows = session.execute(
                select(Agent, Project).join(Project, Project.id == Agent.project_id)
                .where(Agent.project_id.in_(list(by_id))).order_by(Project.slug, Agent.name)
            ).all()
            me = owner_ref_of(principal)
            visible = [
                AgentRecord.of(a, p) for a, p in rows
                if self._manages_all(principal, by_id[p.id]) or (me is not None and a.owner_ref == me and by_id[p.id].resource_role)
            ]
            return visible

        records = await self.db.run(run)
        request = self.pager.request(f"agents:{project or '*'}:{principal.rate_key}", page_size, page_token)
        page = self.pager.page(records, request)
        views = [await self.view(r) for r in page.items]
        return AgentList(agents=views, next_page_token=page.next_page_token)

    async def get(self, principal: Principal, name: str, project: str | None,
                  prefetched: Prefetched | None = None) -> AgentView:
        """`prefetched`: the outcome of `gate_read(name, project)` made with the credential, if it was."""
        return await self.view(await self._locate(principal, name, project, prefetched))

    async def delete(self, principal: Principal, name: str, project: str | None) -> AgentDeleted:
        record = await self._locate(principal, name, project)
        await self._cancel_tasks(record.id)
        self._unpublish(record)
        await self.runtime.delete(record.workload)
        images = await self.db.run(lambda s: {r.image for r in s.scalars(select(AgentRevision).where(AgentRevision.agent_id == record.id))})
        now = self.clock.now()

        def run(session: Session) -> None:
            agent = session.get(Agent, record.id)
            if agent is None:
                return
            if agent.workload_key_id:
                key = session.scalar(select(ApiKey).where(ApiKey.key_id == agent.workload_key_id))
                if key is not None:
                    key.revoked_at = now
            for model in (AgentSecret, AgentFile, AgentBuild, AgentRevision):
                session.execute(delete(model).where(model.agent_id == record.id))
            session.delete(agent)
            self.audit.record(session, record.project.id, principal, "agent.delete", record.name)

        await self.db.run(run)
        if self.forget_bindings is not None:
            try:
                await self.forget_bindings(record.id)
            except Exception:  # noqa: BLE001 - the agent is gone; a stale binding row is harmless
                log.exception("forgetting the bindings of %s failed", record.name)
        if self.forget_memory is not None:
            try:
                await self.forget_memory(self._target_of(record))
            except Exception:  # noqa: BLE001 - the agent is gone; report, do not fail the delete
                log.exception("dropping the long-term memory of %s failed", record.name)
        for image in images:
            with contextlib.suppress(Exception):
                await self.builder.remove(image)
        self._roll_locks.pop(record.id, None)
        return AgentDeleted(agent=record.name, deleted=True)

    async def purge_project(self, project_id: str) -> int:
        """Delete every agent of a project being deleted (for the projects area): runtime workloads, public
        hosts, records, stored source, secrets, builds. Returns how many agents there were."""

        def run(session: Session) -> list[AgentRecord]:
            project = session.get(Project, project_id)
            if project is None:
                return []
            return [AgentRecord.of(a, project) for a in session.scalars(select(Agent).where(Agent.project_id == project_id))]

        records = await self.db.run(run)
        automation = Principal.automation()
        for record in records:
            with contextlib.suppress(NotFound):
                await self.delete(automation, record.name, record.project.id)
        return len(records)

    # == hooks for the identity area ================================================================

    async def project_agent_names(self, project_id: str) -> builtins.list[str]:
        """Names of a project's agents (a project delete refuses while any exist)."""
        return await self.db.run(lambda s: list(s.scalars(select(Agent.name).where(Agent.project_id == project_id).order_by(Agent.name))))

    async def user_agents(self, user_id: str) -> builtins.list[tuple[str, str]]:
        """`(project_id, name)` of the agents a user deployed."""
        return await self.db.run(lambda s: [
            (a.project_id, a.name) for a in s.scalars(select(Agent).where(Agent.owner_ref == f"user:{user_id}"))
        ])

    async def unowned_agents(self) -> builtins.list[AgentView]:
        """Agents with no recorded owner, as agent views (`GET /v1/users`)."""
        records = await self.db.run(lambda s: [
            AgentRecord.of(a, p) for a, p in s.execute(
                select(Agent, Project).join(Project, Project.id == Agent.project_id).where(Agent.owner_ref.is_(None))
                .order_by(Project.slug, Agent.name)
            ).all()
        ])
        return [await self.view(r) for r in records]

    async def model_key_changed(self, key: str | None) -> builtins.list[str]:
        """The platform model key changed: roll every deployed agent that has no MODEL_API_KEY of its own.
        Returns the namespaces where a roll failed."""
        ids = await self.db.run(lambda s: [
            (a.id, a.project_id) for a in s.scalars(select(Agent).where(Agent.image != ""))
            if s.get(AgentSecret, (a.id, "MODEL_API_KEY")) is None
        ])
        failed: set[str] = set()
        for agent_id, project_id in ids:
            try:
                await self._roll(agent_id, "platform model key")
            except Exception:  # noqa: BLE001 - reported to the caller by namespace
                log.exception("rolling %s after a model key change failed", agent_id)
                record = await self._record_by_id(agent_id)
                failed.add(record.project.namespace if record else project_id)
        return sorted(failed)

    # == AgentDirectory (for the invoke path) ========================================================

    async def invoke_target(self, principal: Principal, name: str, project: str | None,
                            prefetched: Prefetched | None = None) -> InvokeTarget:
        """`prefetched`: the outcome of `gate_read(name, project)` made with the credential, if it was."""
        validation.agent_name(name)
        if project is None:
            # One Core statement on the read path: the agents of that name in the caller's visible projects
            # (every project for an anonymous caller). With `?project=`, the project is resolved first.
            if not principal.authenticated:
                found = await self.db.read(lambda c: named_agents(c, name))
            else:
                if prefetched is not None and prefetched.answers((GATE, name), principal):
                    candidates = prefetched.result()  # read for this request, with its credential
                else:
                    now = self.clock.now()
                    candidates = await self.db.read(lambda c: visible_candidates(c, self.access, principal, name, now))
                found = [(agent, ref) for agent, ref, _ in candidates]
            return self._one_target(name, found)

        def run(session: Session) -> InvokeTarget:
            if principal.authenticated:
                grants = self._projects_sync(session, principal, project)
                found = [(a, p) for a, p, _ in self._candidates_sync(session, grants, name)]
            else:
                query = select(Agent, Project).join(Project, Project.id == Agent.project_id).where(Agent.name == name)
                if project:
                    ids = [p.id for p in self.access.project_by_ref_sync(session, project)]
                    query = query.where(Agent.project_id.in_(ids))
                found = [(a, p) for a, p in session.execute(query).all()]
            return self._one_target(name, found)

        return await self.db.read_session(run)  # a read-only lookup: no transaction to commit

    def _one_target(self, name: str, found: Sequence[tuple[Agent | AgentRow, Project | ProjectRef]]) -> InvokeTarget:
        if not found:
            raise NotFound(unknown_agent(name))
        if len(found) > 1:
            raise Conflict(f"agent {name} exists in several projects; add ?project=<slug> or sign in")
        return self._target(*found[0])

    async def manage_target(self, principal: Principal, name: str, project: str | None) -> InvokeTarget:
        self.access.require_management(principal)

        def run(session: Session) -> InvokeTarget:
            agent, proj, _ = self._locate_sync(session, principal, name, project)
            return self._target(agent, proj)

        return await self.db.run(run)
