"""The agent-secret port: the per-agent secret map that bindings write into.

An agent's secret is a flat map of environment-variable names to values, delivered to the agent's
running revisions. Bindings (`SecretStore.apply` / `unbind`) reach agents only through this port; the
agents area implements it for real (its per-agent secret, revisions and rollout). Every change here is
followed by `roll_revision`, because running revisions never change (document 1).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AgentRef:
    """An agent as bindings see it: its id, its name (shown as `agent_slug`) and its project."""

    id: str
    name: str
    project_id: str


class AgentSecrets(abc.ABC):
    @abc.abstractmethod
    async def find_agent(self, project_id: str, name: str) -> AgentRef | None:
        """The agent called `name` in the project, or None when there is none."""

    @abc.abstractmethod
    async def get_agent(self, agent_id: str) -> AgentRef | None:
        """The agent with this id, or None when it was deleted."""

    @abc.abstractmethod
    async def set_keys(self, agent: AgentRef, values: Mapping[str, str]) -> None:
        """Set every key of `values` in the agent's secret, all or nothing; other keys are kept.

        Raises on failure, in which case no key was changed.
        """

    @abc.abstractmethod
    async def remove_keys(self, agent: AgentRef, keys: Sequence[str]) -> list[str]:
        """Remove these keys from the agent's secret; returns those that were present."""

    @abc.abstractmethod
    async def roll_revision(self, agent: AgentRef, reason: str) -> bool:
        """Roll a new revision so that running instances pick up the changed secret.

        Returns False when there is nothing to roll (the agent has no deployed revision yet).
        """
