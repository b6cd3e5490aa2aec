"""Agents and functions on the platform (document 1): deploy a tarball, build it in the background, roll
immutable revisions, and manage env, secrets, source files, compute config, traffic, logs and embed.

Every change to what an agent runs (image, env, secrets, config) rolls a new revision through `_roll`,
the one place that builds a `RevisionSpec` (see docs/decisions/agents.md for the env contract). State
lives in the database (`db/models/agents.py`); the running side lives in the workload runtime.

`AgentService` is one object built in layers, one concern per module, each layer on the one below:
`base` (construction, background tasks, the owner gate, the view) < `publishing` (public hosts, embed)
< `rollout` (revisions, readiness, traffic, spec, metrics) < `builds` (deploy, redeploy, build claims)
< `configuration` (env, secrets, config, logs, stored files) < `service` (list, get, delete, targets).
The agent-secret port on its tables lives with the adapters (`adapters/tables/agent_secrets.py`).
"""

from caiplatform.services.agents.records import (
    FILE_BODY_LIMIT,
    SECRETS_BODY_LIMIT,
    AgentRecord,
    DeployUpload,
    build_lock,
    owner_ref_of,
    sandbox_url,
)
from caiplatform.services.agents.service import AgentService

__all__ = [
    "FILE_BODY_LIMIT",
    "SECRETS_BODY_LIMIT",
    "AgentRecord",
    "AgentService",
    "DeployUpload",
    "build_lock",
    "owner_ref_of",
    "sandbox_url",
]
