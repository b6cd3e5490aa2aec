"""How the invoke path finds an agent: the contract between the agents area (which owns agent records,
ownership, project pinning and embed configs) and the invoke area (which talks to running agents).

`AgentService` implements `AgentDirectory`; `InvokeService` only depends on this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from caiplatform.db.prefetch import Prefetched
from caiplatform.ports.runtime import WorkloadRef
from caiplatform.principal import Principal


@dataclass(frozen=True)
class InvokeTarget:
    agent: str  # the agent's name, as in `invoke agent <name>: ...`
    agent_id: str
    project_id: str
    project_short: str
    kind: str  # agent | function
    framework: str
    workload: WorkloadRef  # what the runtime serves


@dataclass(frozen=True)
class EmbedTarget:
    target: InvokeTarget
    config: dict[str, Any]  # the public embed config (`allowed_origins`, `title`, ...)
    allowed_origins: list[str] = field(default_factory=list)


class AgentDirectory(Protocol):
    async def invoke_target(self, principal: Principal, name: str, project: str | None,
                            prefetched: Prefetched | None = None) -> InvokeTarget:
        """The agent `name` as this caller may invoke it (document 1, invoke rule 6).

        `prefetched`: what the route's `reads_with_credential` read beside the credential, if anything (a
        directory that has no use for it reads as it would without it).

        `project` is the optional `?project=<slug|short|id>`. Raises `NotFound("unknown agent: <name>")`
        for an unknown or invisible agent and `Conflict` (add `?project=<slug>` or sign in) for a name
        in several projects. Anonymous callers see every agent (the data plane is open by default)."""
        ...

    async def manage_target(self, principal: Principal, name: str, project: str | None) -> InvokeTarget:
        """The same, behind the owner gate of the management routes (session browsing, memorize)."""
        ...

    async def embed_target(self, key: str) -> EmbedTarget | None:
        """The agent whose current embed key is `key` and whose embed config is enabled, or None."""
        ...
