"""What the agents service shares across its parts: limits, the specification's messages, the agent
record snapshot, the decoded deploy form.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from caiplatform.db.models import Project
from caiplatform.db.models.agents import Agent
from caiplatform.domain.agents import unknown_agent as unknown_agent
from caiplatform.domain.spec_document import REDACTED
from caiplatform.ports.runtime import (
    WorkloadRef,
)
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.services.access import ProjectRef
from caiplatform.services.agents.lookup import AgentRow
from caiplatform.services.invoke_errors import NO_MODEL_ENDPOINT

log = logging.getLogger(__name__)


MiB = 1024 * 1024
#: Where the identity area keeps the platform-wide default model key (`platform_settings`).
PLATFORM_MODEL_KEY_SETTING = "model_api_key"
#: A build claim older than this may be taken over (a crashed server never released it).
BUILD_CLAIM_TTL = timedelta(minutes=30)
#: How often each replica looks for builds whose replica died (their work lock is free).
BUILD_TAKEOVER_SECONDS = 2.0
#: How long a rolled revision may take to become ready before the agent is marked failed.
READY_TIMEOUT_SECONDS = 300.0
READY_POLL_SECONDS = 0.25
SECRETS_BODY_LIMIT = 1 * MiB
#: The read-token TTL a workload asks for when it reads project secrets (caiplatform.workload's default).
WORKLOAD_TOKEN_TTL_SECONDS = 300


def sandbox_url(base_url: str | None, project_id: str) -> str:
    """`SANDBOX_URL` of a project's agents: the platform's own code sandbox route for that project."""
    return f"{(base_url or '').rstrip('/')}/v1/projects/{project_id}/sandbox" if base_url else ""
FILE_BODY_LIMIT = 4 * MiB  # JSON escaping may grow 1 MiB of text
LOG_HISTORY_DEFAULT = 500

NO_SOURCE = "no source is stored for this agent - deploy it once from the CLI or upload files first"
NOTHING_TO_DO = "nothing to do: provide 'set' and/or 'remove'"
FILE_NOTE = "saved to the stored source; the running agent is unchanged - redeploy (POST /v1/agents/{name}/redeploy) for it to take effect"
FILES_NOTE = "the stored source of the last deploy plus later edits (latest version only); redeploy to run it"
REDEPLOY_NOTE = "rebuilding from the stored source; poll GET /v1/agents/{name} until ready"
DEPLOY_NOTE = "building; poll GET /v1/agents/{name} until ready"
MODEL_FRAMEWORKS = ("adk", "langgraph", "crewai")
NO_MODEL_ENDPOINT_NOTE = f"{NO_MODEL_ENDPOINT} (until then every invoke of this agent fails)"
SPEC_NOTE = f"live object with managed fields and last-applied annotations removed; values of env vars whose names look sensitive read {REDACTED}"
METRICS_NOTE = "live counts only; no history is kept"
HISTORY_NOTE = "persisted log lines, oldest first; retention {retention}"
TRAFFIC_REQUIRED = (
    'traffic is required - send the complete split, e.g. {"traffic": [{"revision_name": "<name>-00002", "percent": 100}]}'
)


def build_in_progress(name: str) -> str:
    return f"a build is already in progress for agent {name}"


def invalid_key(key: Any) -> str:
    return f"invalid secret key (must be a valid environment variable name): {key}"


def quota_message(used: int, hard: int) -> str:
    return (
        f"this project is at its service limit ({used} / {hard}): the revision cannot get a network route yet; "
        "delete a service or raise the project's service quota, then redeploy"
    )


@dataclass(frozen=True)
class AgentRecord:
    """A snapshot of an agent row, safe to use outside its database session."""

    id: str
    project: ProjectRef
    name: str
    kind: str
    framework: str
    runtime: str | None
    owner_ref: str | None
    owner_email: str
    state: str
    message: str
    image: str
    latest_revision: str
    generation: int
    env: dict[str, str]
    config: dict[str, Any]
    embed: dict[str, Any] | None
    external_url: str
    created_at: datetime
    updated_at: datetime

    @property
    def workload(self) -> WorkloadRef:
        return WorkloadRef(self.project.id, self.project.short, self.name, self.kind)

    @classmethod
    def of(cls, row: Agent | AgentRow, project: Project | ProjectRef) -> AgentRecord:
        return cls(
            id=row.id, project=project if isinstance(project, ProjectRef) else ProjectRef.of(project), name=row.name, kind=row.kind, framework=row.framework,
            runtime=row.runtime, owner_ref=row.owner_ref, owner_email=row.owner_email or "", state=row.state,
            message=row.message or "", image=row.image or "", latest_revision=row.latest_revision or "",
            generation=row.generation, env=dict(row.env or {}), config=dict(row.config or {}),
            embed=dict(row.embed) if row.embed else None, external_url=row.external_url or "",
            created_at=row.created_at, updated_at=row.updated_at,
        )


@dataclass
class DeployUpload:
    """The decoded multipart form of POST /v1/agents (the route only decodes; rules live here)."""

    fields: dict[str, str] = field(default_factory=dict)
    code: bytes | None = None
    unknown: list[str] = field(default_factory=list)
    code_not_a_file: bool = False


def build_lock(build_id: str) -> str:
    """The work lock a build runs under."""
    return f"agent-build:{build_id}"


def owner_ref_of(principal: Principal) -> str | None:
    if principal.kind is PrincipalKind.USER and principal.user_id:
        return f"user:{principal.user_id}"
    if principal.kind is PrincipalKind.SERVICE_ACCOUNT and principal.service_account_id:
        return f"sa:{principal.service_account_id}"
    return None  # automation token and the platform itself: a tokenless deploy, no recorded owner
