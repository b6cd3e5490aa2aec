"""In-memory agent secrets: records every write, removal and revision roll so tests can assert them.

Agents are registered with `add_agent` (the agents area owns the real registry). `fail_next(op)` makes
the next call of `set_keys`, `remove_keys` or `roll_revision` raise, to exercise failure paths.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from caiplatform.errors import Unavailable
from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets


@dataclass(frozen=True)
class Recorded:
    op: str  # "set", "remove" or "roll"
    agent_id: str
    keys: tuple[str, ...] = ()
    reason: str = ""


@dataclass
class _Agent:
    ref: AgentRef
    secret: dict[str, str] = field(default_factory=dict)
    revisions: int = 0
    deployed: bool = True


class InMemoryAgentSecrets(AgentSecrets):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._agents: dict[str, _Agent] = {}
        self._fail: dict[str, Exception] = {}
        self.log: list[Recorded] = []

    # -- test/setup surface -------------------------------------------------------------------------------

    def add_agent(self, project_id: str, name: str, *, agent_id: str | None = None, deployed: bool = True) -> AgentRef:
        ref = AgentRef(id=agent_id or str(uuid.uuid4()), name=name, project_id=project_id)
        with self._lock:
            self._agents[ref.id] = _Agent(ref=ref, deployed=deployed)
        return ref

    def remove_agent(self, agent_id: str) -> None:
        with self._lock:
            self._agents.pop(agent_id, None)

    def secret_of(self, agent: AgentRef | str) -> dict[str, str]:
        agent_id = agent if isinstance(agent, str) else agent.id
        with self._lock:
            return dict(self._agents[agent_id].secret)

    def revisions_of(self, agent: AgentRef | str) -> int:
        agent_id = agent if isinstance(agent, str) else agent.id
        with self._lock:
            return self._agents[agent_id].revisions

    def fail_next(self, op: str, exc: Exception | None = None) -> None:
        """Make the next `op` ("set", "remove", "roll") raise `exc` (default a 503)."""
        self._fail[op] = exc or Unavailable(f"agent secret {op} failed (injected)")

    def _maybe_fail(self, op: str) -> None:
        exc = self._fail.pop(op, None)
        if exc is not None:
            raise exc

    def _agent(self, agent: AgentRef) -> _Agent:
        found = self._agents.get(agent.id)
        if found is None:
            raise KeyError(f"unknown agent {agent.name}")
        return found

    # -- port ---------------------------------------------------------------------------------------------

    async def find_agent(self, project_id: str, name: str) -> AgentRef | None:
        with self._lock:
            for agent in self._agents.values():
                if agent.ref.project_id == project_id and agent.ref.name == name:
                    return agent.ref
        return None

    async def get_agent(self, agent_id: str) -> AgentRef | None:
        with self._lock:
            found = self._agents.get(agent_id)
            return None if found is None else found.ref

    async def set_keys(self, agent: AgentRef, values: Mapping[str, str]) -> None:
        self._maybe_fail("set")
        with self._lock:
            self._agent(agent).secret.update(values)
            self.log.append(Recorded("set", agent.id, tuple(sorted(values))))

    async def remove_keys(self, agent: AgentRef, keys: Sequence[str]) -> list[str]:
        self._maybe_fail("remove")
        with self._lock:
            secret = self._agent(agent).secret
            removed = [k for k in keys if secret.pop(k, None) is not None]
            self.log.append(Recorded("remove", agent.id, tuple(keys)))
            return removed

    async def roll_revision(self, agent: AgentRef, reason: str) -> bool:
        self._maybe_fail("roll")
        with self._lock:
            found = self._agent(agent)
            if not found.deployed:
                return False
            found.revisions += 1
            self.log.append(Recorded("roll", agent.id, reason=reason))
            return True
