"""Agents and functions rolled out through another replica, served here too.

Each replica runs its own workload runtime (on one machine: processes of the replica). The replica that
builds an agent rolls its revision on its runtime; every other replica follows the database within
`FOLLOW_SECONDS`: it applies the newest revision that may serve (not refused) to its own runtime, building
the image first from the sources in the database when its builder does not have it (the same sources give
the same image reference everywhere), and registers the published host. It writes nothing: the replica
that rolled the revision records its state. A deleted agent is removed from this replica's runtime.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.db.models import Agent, AgentRevision, Project
from caiplatform.periodic import PeriodicWork

if TYPE_CHECKING:
    from caiplatform.services.agents import AgentRecord, AgentService

log = logging.getLogger(__name__)

FOLLOW_SECONDS = 3.0


class AgentFollower(PeriodicWork):
    name = "agent-follower"

    def __init__(self, agents: AgentService, interval: float = FOLLOW_SECONDS):
        super().__init__(interval)
        self.agents = agents
        self._served: dict[str, tuple[AgentRecord, str]] = {}  # workload key → (record, revision applied)

    async def round(self) -> None:
        await self.follow()

    async def follow(self) -> None:
        """One round: serve the newest servable revision of every agent here, drop deleted agents."""
        from caiplatform.services.agents import AgentRecord

        svc = self.agents

        def read(session: Session) -> list[tuple[AgentRecord, str, int, dict[str, str], str | None]]:
            out = []
            for agent in session.scalars(select(Agent).where(Agent.image.is_not(None))):
                revision = session.scalar(
                    select(AgentRevision).where(AgentRevision.agent_id == agent.id, AgentRevision.reason == "")
                    .order_by(AgentRevision.generation.desc()).limit(1))
                project = session.get(Project, agent.project_id)
                if revision is None or project is None or not agent.image:
                    continue
                out.append((AgentRecord.of(agent, project), revision.name, revision.generation,
                            svc._secret_values_sync(session, agent.id), agent.workload_key))
            return out

        present: set[str] = set()
        for record, revision, generation, values, workload_key in await svc.db.run(read):
            key = record.workload.key
            present.add(key)
            served = self._served.get(key)
            if served is not None and served[1] == revision:
                continue
            try:
                await self._serve(record, revision, generation, values, workload_key)
            except Exception:  # noqa: BLE001 - one agent must not stop the others; retried next round
                log.exception("agents: could not serve %s here", record.name)
                continue
            self._served[key] = (record, revision)
        for key in [k for k in self._served if k not in present]:
            record, _ = self._served.pop(key)
            await svc.runtime.delete(record.workload)
            svc.hosts.unregister(svc.hosts.host_for(record.name, record.project.short))

    async def _serve(self, record: AgentRecord, revision: str, generation: int, values: dict[str, str],
                     workload_key: str | None) -> None:
        svc = self.agents
        # Its Valkey user (server mode), also for instances this replica starts again after a restart.
        await svc.ensure_session_user(record)
        # A cluster is every replica's runtime: the replica that rolled the revision applied it for all.
        status = None if svc.runtime.shared else await svc.runtime.status(record.workload)
        if not svc.runtime.shared and (status is None or revision not in {r.name for r in status.revisions}):
            if await svc.builder.resolve(record.image) is None:
                image = await svc.build_image(record)
                if image.reference != record.image:  # the sources changed since: the next round sees it
                    raise LookupError(f"{record.name}: built {image.reference}, the record says {record.image}")
            spec = svc.revision_spec(record, revision, generation, values, workload_key, "replica")
            await svc.runtime.apply(spec)
        if record.state == "ready":
            await svc._publish(record)
