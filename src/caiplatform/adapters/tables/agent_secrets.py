"""The agent-secret port on the agents area's tables, and a proxy that resolves it on first use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from caiplatform.db import Database
from caiplatform.db.models.agents import Agent, AgentSecret
from caiplatform.domain.agents import unknown_agent
from caiplatform.errors import NotFound
from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets


class AgentSecretsOnTables(AgentSecrets):
    """The agent-secret port on the agents area's tables: bindings reach real agents and roll them."""

    def __init__(self, db: Database, roll: Callable[[str, str], Awaitable[bool]]):
        self.db = db
        self._roll = roll  # the agents service's rollout of a new revision

    async def find_agent(self, project_id: str, name: str) -> AgentRef | None:
        row = await self.db.run(lambda s: s.scalar(select(Agent.id).where(Agent.project_id == project_id, Agent.name == name)))
        return None if row is None else AgentRef(row, name, project_id)

    async def get_agent(self, agent_id: str) -> AgentRef | None:
        def run(session: Session) -> AgentRef | None:
            agent = session.get(Agent, agent_id)
            return None if agent is None else AgentRef(agent.id, agent.name, agent.project_id)

        return await self.db.run(run)

    async def set_keys(self, agent: AgentRef, values: Any) -> None:
        def run(session: Session) -> None:
            if session.get(Agent, agent.id) is None:
                raise NotFound(unknown_agent(agent.name))
            for key, value in values.items():
                session.merge(AgentSecret(agent_id=agent.id, key=key, value=self.db.seal_secret(value)))

        await self.db.run(run)

    async def remove_keys(self, agent: AgentRef, keys: Any) -> list[str]:
        def run(session: Session) -> list[str]:
            present = list(session.scalars(
                select(AgentSecret.key).where(AgentSecret.agent_id == agent.id, AgentSecret.key.in_(list(keys)))
            ))
            if present:
                session.execute(delete(AgentSecret).where(AgentSecret.agent_id == agent.id, AgentSecret.key.in_(present)))
            return [k for k in keys if k in present]

        return await self.db.run(run)

    async def roll_revision(self, agent: AgentRef, reason: str) -> bool:
        return await self._roll(agent.id, reason)


class LazyAgentSecrets(AgentSecrets):
    """The agent-secret port, resolved on first use (the agents service needs the builder and runtime,
    which the platform creates lazily)."""

    def __init__(self, resolve: Callable[[], AgentSecrets]):
        self._resolve = resolve

    async def find_agent(self, project_id: str, name: str) -> AgentRef | None:
        return await self._resolve().find_agent(project_id, name)

    async def get_agent(self, agent_id: str) -> AgentRef | None:
        return await self._resolve().get_agent(agent_id)

    async def set_keys(self, agent: AgentRef, values: Any) -> None:
        await self._resolve().set_keys(agent, values)

    async def remove_keys(self, agent: AgentRef, keys: Any) -> list[str]:
        return await self._resolve().remove_keys(agent, keys)

    async def roll_revision(self, agent: AgentRef, reason: str) -> bool:
        return await self._resolve().roll_revision(agent, reason)
