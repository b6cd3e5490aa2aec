"""Agents and functions on the platform (document 1): deploy a tarball, build it in the background, roll
immutable revisions, and manage env, secrets, source files, compute config, traffic, logs and embed.

Every change to what an agent runs (image, env, secrets, config) rolls a new revision through `_roll`,
the one place that builds a `RevisionSpec` (see docs/decisions/agents.md for the env contract). State
lives in the database (`db/models/agents.py`); the running side lives in the workload runtime.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import math
import secrets as pysecrets
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform import json_input, security, validation
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database, new_id
from caiplatform.db.models import ApiKey, PlatformSetting, Project
from caiplatform.db.models.agents import Agent, AgentBuild, AgentFile, AgentRevision, AgentSecret
from caiplatform.domain import agent_source
from caiplatform.domain import agents as rules
from caiplatform.domain.spec_document import REDACTED, sanitize_spec
from caiplatform.errors import BadRequest, Conflict, Forbidden, NotFound, PlatformError
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.agent_secrets import AgentRef, AgentSecrets
from caiplatform.ports.builder import Builder, BuildError, BuildRequest, Image, truncate_build_message
from caiplatform.ports.runtime import (
    Resources,
    RevisionSpec,
    RevisionStatus,
    Scaling,
    TrafficTarget,
    WorkloadError,
    WorkloadRef,
    WorkloadRuntime,
    WorkloadStatus,
)
from caiplatform.principal import Principal, PrincipalKind
from caiplatform.ratelimit import TokenBucketLimiter
from caiplatform.redaction import without_paths
from caiplatform.routing import HostGuard, HostRouter, Refusal, Upstream
from caiplatform.services.access import Access, ProjectGrant, ProjectRef
from caiplatform.services.agent_directory import EmbedTarget, InvokeTarget
from caiplatform.services.audit import AuditLog
from caiplatform.services.invoke_errors import NO_MODEL_ENDPOINT
from caiplatform.services.service_quota import ServiceQuota, ServiceQuotaExceeded, services_hard
from caiplatform.settings import Settings
from caiplatform.turns.browse import workload_internal_token
from caiplatform.validation import AGENT_NAME, ENV_NAME
from caiplatform.worklocks import LocalWorkLocks

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


def unknown_agent(name: str) -> str:
    return f"unknown agent: {name}"


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
    def of(cls, row: Agent, project: Project) -> AgentRecord:
        return cls(
            id=row.id, project=ProjectRef.of(project), name=row.name, kind=row.kind, framework=row.framework,
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


class AgentService:
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
        self._tasks: dict[str, set[asyncio.Task[Any]]] = {}
        self._roll_locks: dict[str, asyncio.Lock] = {}
        # The project services quota, shared with the serverless area (the platform passes one object).
        self.quota = quota if quota is not None else ServiceQuota(runtime.usage)
        self.secret_port = AgentSecretsOnTables(self)
        # A build runs under its work lock; replaced by the platform with locks in its database, so a
        # build whose replica died (lock free, agent still `building`) is taken over by another.
        self.locks: Any = LocalWorkLocks()
        self._takeover: asyncio.Task[None] | None = None

    # == lifecycle ===================================================================================

    async def start(self) -> None:
        """After a restart: finish builds and rollouts that were under way, re-publish public hosts.
        (The platform starts the shared runtime first.)"""
        rows = await self.db.run(lambda s: [(a.id, a.state, a.build_id) for a in s.scalars(select(Agent))])
        for agent_id, state, build_id in rows:
            if state == "building" and build_id:
                await self._resume_build(agent_id, build_id)
            elif state == "deploying":
                self._spawn(agent_id, self._watch_latest(agent_id))
            elif state == "ready":
                record = await self._record_by_id(agent_id)
                if record is not None:
                    await self._publish(record)

    def take_over_builds(self, interval: float = BUILD_TAKEOVER_SECONDS) -> None:
        """Every `interval`, resume the builds and rollout watches whose replica died (several replicas
        on one database)."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    unsettled = await self.db.run(lambda s: [(a.id, a.state, a.build_id) for a in s.scalars(
                        select(Agent).where(Agent.state.in_(("building", "deploying"))))])
                    for agent_id, state, build_id in unsettled:
                        if state == "building" and build_id:
                            await self._resume_build(agent_id, build_id)
                        elif state == "deploying" and not self._tasks.get(agent_id):
                            # A rollout whose watcher died with its replica (a live one keeps its lock).
                            self._spawn(agent_id, self._watch_latest(agent_id))
                except Exception:  # noqa: BLE001 - the next round tries again
                    log.exception("agents: looking for builds to take over failed")

        if self._takeover is None:
            self._takeover = asyncio.get_running_loop().create_task(loop(), name="agent-build-takeover")

    async def _resume_build(self, agent_id: str, build_id: str) -> None:
        """Run a recorded build here when no replica holds its work lock."""
        if await self.locks.try_acquire(build_lock(build_id)):
            log.warning("agents: resuming build %s of agent %s (no replica is running it)", build_id, agent_id)
            self._spawn(agent_id, self._build_and_roll(agent_id, build_id, None))

    async def close(self) -> None:
        if self._takeover is not None:
            self._takeover.cancel()
            with contextlib.suppress(BaseException):
                await self._takeover
            self._takeover = None
        tasks = [t for group in self._tasks.values() for t in group]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        self._tasks.clear()

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

    def _owner_gate_sync(self, session: Session, principal: Principal, grant: ProjectGrant, agent: Agent) -> None:
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

    def _locate_sync(self, session: Session, principal: Principal, name: str, project: str | None) -> tuple[Agent, Project, ProjectGrant]:
        """The owner gate of every management route."""
        validation.agent_name(name)  # 400 `invalid agent name (must be a lowercase DNS label)`
        grants = self._projects_sync(session, principal, project)
        found = self._candidates_sync(session, grants, name)
        if not found:
            raise NotFound(unknown_agent(name))
        if len(found) > 1:
            # Someone else's agent looks like a missing one: only the ones this caller may manage count.
            allowed, refusals = [], []
            for candidate in found:
                try:
                    self._owner_gate_sync(session, principal, candidate[2], candidate[0])
                    allowed.append(candidate)
                except (NotFound, Forbidden) as exc:
                    refusals.append(exc)
            if len(allowed) > 1:
                raise Conflict(
                    f"agent {name} exists in several projects ({', '.join(sorted(p.slug for _, p, _ in allowed))}); "
                    "add ?project=<slug> to choose one"
                )
            if not allowed:
                raise next((e for e in refusals if isinstance(e, Forbidden)), refusals[0])
            return allowed[0]
        agent, proj, grant = found[0]
        self._owner_gate_sync(session, principal, grant, agent)
        return agent, proj, grant

    async def _locate(self, principal: Principal, name: str, project: str | None) -> AgentRecord:
        self.access.require_management(principal)

        def run(session: Session) -> AgentRecord:
            agent, proj, _ = self._locate_sync(session, principal, name, project)
            return AgentRecord.of(agent, proj)

        return await self.db.run(run)

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

    def _internal_url(self, record: AgentRecord, status: WorkloadStatus | None) -> str:
        if status is not None and status.url:
            return status.url
        return f"http://{record.name}.{record.project.namespace}.svc.cluster.local"

    async def _status(self, record: AgentRecord) -> WorkloadStatus | None:
        try:
            return await self.runtime.status(record.workload)
        except Exception:  # noqa: BLE001 - a view must not fail because the runtime hiccuped
            log.exception("runtime status of %s failed", record.name)
            return None

    async def view(self, record: AgentRecord, status: WorkloadStatus | None = None) -> dict[str, Any]:
        if status is None:
            status = await self._status(record)
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
            "url": self._internal_url(record, status),
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
        return body

    def _lacks_model_endpoint(self, framework: str, env: dict[str, Any] | None) -> bool:
        return framework in MODEL_FRAMEWORKS and not self.settings.model_base_url and not (env or {}).get("MODEL_BASE_URL")

    # == deploy ======================================================================================

    async def deploy(self, principal: Principal, project: str | None, upload: DeployUpload) -> dict[str, Any]:
        self.access.require_management(principal)
        if upload.unknown:
            raise BadRequest(rules.unknown_field_message(upload.unknown[0]))
        name = upload.fields.get("name", "")
        if not AGENT_NAME.match(name or ""):
            raise BadRequest(rules.NAME_MESSAGE)
        framework, runtime, kind = rules.framework_of(upload.fields.get("framework"), upload.fields.get("runtime"))
        if upload.code is None:
            if upload.code_not_a_file:
                raise BadRequest("missing 'code' file field: 'code' must be a file part holding the .tar.gz, not text")
            raise BadRequest("missing 'code' file field: attach the .tar.gz of the agent directory as the file part 'code'")
        config: dict[str, Any] | None = None
        raw_config = upload.fields.get("config", "")
        if raw_config.strip():
            try:
                parsed = json_input.decode(raw_config)
            except json_input.JSONInputError as exc:
                raise BadRequest(f"invalid 'config' field: {exc}") from None
            if not isinstance(parsed, dict):
                raise BadRequest("invalid 'config' field: expected a JSON object")
            try:
                config = rules.merge_config({}, parsed)
            except BadRequest as exc:
                raise BadRequest(f"invalid 'config' field: {exc.message}") from None
        # Up to 64 MiB of gzip to inflate and check: in a worker thread, never on the event loop.
        files = await anyio.to_thread.run_sync(agent_source.extract_tarball, upload.code)
        return await self._claim_and_build(principal, project, name, files, framework=framework, runtime=runtime, kind=kind, config=config)

    async def redeploy(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        count = await self.db.run(lambda s: len(list(s.scalars(select(AgentFile.path).where(AgentFile.agent_id == record.id)))))
        if count == 0:
            raise BadRequest(NO_SOURCE)
        result = await self._claim_and_build(
            principal, record.project.id, record.name, None, framework=record.framework, runtime=record.runtime,
            kind=record.kind, config=None,
        )
        note = REDEPLOY_NOTE.format(name=record.name)
        if "note" in result:  # the model endpoint is missing: the redeploy says so too
            note += "; " + NO_MODEL_ENDPOINT_NOTE
        return {**result, "files": count, "note": note}

    def _cloud_credential_check(self, project: Project) -> None:
        settings = project.settings or {}
        if "platform_cloud" in settings and settings["platform_cloud"] is None:
            raise Conflict(
                f"project {project.slug} has no cloud credential mapped: deploy refused before anything is built; "
                f"a project admin maps one (PUT /v1/projects/{project.id}/platform-cloud), then deploy again"
            )

    async def _claim_and_build(
        self, principal: Principal, project: str | None, name: str, files: dict[str, bytes] | None, *,
        framework: str, runtime: str | None, kind: str, config: dict[str, Any] | None,
    ) -> dict[str, Any]:
        now = self.clock.now()
        build_id = new_id()

        def quota(session: Session) -> tuple[str, int, bool]:
            grant = self._deploy_project_sync(session, principal, name, project)
            proj = self._project_sync(session, grant.project.id)
            agent_id = session.scalar(select(Agent.id).where(Agent.project_id == proj.id, Agent.name == name))
            routed = agent_id is not None and session.scalar(
                select(AgentRevision.name).where(AgentRevision.agent_id == agent_id, AgentRevision.reason == "").limit(1)
            ) is not None
            return proj.namespace, self._service_quota_sync(session, proj), routed

        namespace, hard, routed = await self.db.run(quota)
        if not routed:
            # A new agent needs a route: refuse before building when the project is already full.
            try:
                await self.quota.check(namespace, hard)
            except ServiceQuotaExceeded as exc:
                raise Conflict(quota_message(exc.used, exc.hard)) from None

        def claim(session: Session) -> tuple[str, dict[str, Any]]:
            grant = self._deploy_project_sync(session, principal, name, project)
            proj = self._project_sync(session, grant.project.id)
            if grant.resource_role is None:
                raise Forbidden("this action requires a resource role on the project")
            self._cloud_credential_check(proj)
            agent = session.scalar(select(Agent).where(Agent.project_id == proj.id, Agent.name == name).with_for_update())
            redeploy = agent is not None
            if agent is not None:
                if files is not None:  # a deploy over an existing name: the owner gate decides
                    if not self._manages_all(principal, grant) and agent.owner_ref is not None and agent.owner_ref != owner_ref_of(principal):
                        raise Conflict(f"agent {name} already exists in project {proj.slug} and belongs to someone else")
                    if agent.owner_ref is None and not self._manages_all(principal, grant):
                        raise Forbidden(f"agent {name} has no recorded owner: only a project admin can redeploy or manage it")
                if agent.build_claimed_at is not None and now - agent.build_claimed_at < BUILD_CLAIM_TTL:
                    raise Conflict(build_in_progress(name))
                if agent.owner_ref is None and owner_ref_of(principal) is not None:
                    agent.owner_ref, agent.owner_email = owner_ref_of(principal), principal.email or ""  # adoption
            else:
                minted = security.mint_workload_key()
                session.add(ApiKey(key_id=minted.key_id, secret_hash=minted.secret_hash, kind="workload",
                                   display_name=f"agent {name}", project_id=proj.id, created_at=now))
                agent = Agent(
                    project_id=proj.id, name=name, kind=kind, framework=framework, runtime=runtime,
                    owner_ref=owner_ref_of(principal), owner_email=principal.email or "" if owner_ref_of(principal) else "",
                    env={}, config={}, workload_key_id=minted.key_id, workload_key=minted.secret,
                    created_at=now, updated_at=now,
                )
                session.add(agent)
                session.flush()
            agent.kind, agent.framework, agent.runtime = kind, framework, runtime
            if config is not None:
                agent.config = rules.merge_config(agent.config or {}, config)
            agent.state, agent.message = "building", ""
            agent.build_id, agent.build_claimed_at, agent.updated_at = build_id, now, now
            if files is not None:
                self._replace_files_sync(session, agent.id, files, now)
            session.add(AgentBuild(id=build_id, agent_id=agent.id, started_at=now))
            action = "agent.redeploy" if redeploy or files is None else "agent.deploy"
            self.audit.record(session, proj.id, principal, action, name, {"build_id": build_id, "framework": framework})
            return agent.id, dict(agent.env or {})

        # Held before the claim is visible, so no other replica takes this build for an orphan.
        await self.locks.try_acquire(build_lock(build_id))
        try:
            agent_id, env = await self.db.run(claim)
        except IntegrityError:  # a concurrent first deploy of the same name won the insert
            await self.locks.release(build_lock(build_id))
            raise Conflict(build_in_progress(name)) from None
        except BaseException:
            await self.locks.release(build_lock(build_id))
            raise
        self._spawn(agent_id, self._build_and_roll(agent_id, build_id, principal))
        result = {"agent": name, "build_id": build_id}
        if self._lacks_model_endpoint(framework, env):
            result["note"] = DEPLOY_NOTE.format(name=name) + "; " + NO_MODEL_ENDPOINT_NOTE
        return result

    def _replace_files_sync(self, session: Session, agent_id: str, files: dict[str, bytes], now: datetime) -> None:
        session.execute(delete(AgentFile).where(AgentFile.agent_id == agent_id))
        for path, content in files.items():
            session.add(AgentFile(agent_id=agent_id, path=path, content=content, size=len(content), updated_at=now))

    async def _finish_build(self, agent_id: str, build_id: str, *, ok: bool, message: str = "", image: str = "") -> bool:
        """Record a build's end and release the claim; False when the claim is no longer ours."""
        now = self.clock.now()
        message = without_paths(message)  # build output names the server's build directories

        def run(session: Session) -> bool:
            build = session.get(AgentBuild, build_id)
            if build is not None:
                build.state, build.message, build.image, build.finished_at = ("succeeded" if ok else "failed"), message, image, now
            agent = session.get(Agent, agent_id)
            if agent is None or agent.build_id != build_id:
                return False
            agent.build_claimed_at = None
            agent.updated_at = now
            if ok:
                agent.state, agent.message, agent.image = "deploying", "", image
            else:
                agent.state, agent.message = "failed", truncate_build_message(message)
            return True

        return await self.db.run(run)

    async def _build_and_roll(self, agent_id: str, build_id: str, principal: Principal | None) -> None:
        """The build under its work lock (taken by the caller), then the roll."""
        try:
            built = await self._build(agent_id, build_id, principal)
        finally:
            await self.locks.release(build_lock(build_id))
        if built:
            await self._roll(agent_id, "deploy", watch=False)
            await self._watch_latest(agent_id)

    async def build_image(self, record: AgentRecord) -> Image:
        """The image of the agent's stored sources, from this replica's builder (the same sources give
        the same image reference on every replica)."""
        files = await self.db.run(
            lambda s: {f.path: f.content for f in s.scalars(select(AgentFile).where(AgentFile.agent_id == record.id))}
        )
        with tempfile.TemporaryDirectory(prefix=f"cai-build-{record.name}-") as tmp:
            agent_source.write_tree(files, Path(tmp))
            return await self.builder.build(BuildRequest(
                project_id=record.project.id, project_short=record.project.short, workload=record.name,
                framework=record.framework, source_dir=Path(tmp), runtime=record.runtime,
            ))

    async def _build(self, agent_id: str, build_id: str, principal: Principal | None) -> bool:
        """Build the image and record the end of the build; True when the agent should roll it out."""
        record = await self._record_by_id(agent_id)
        if record is None:
            return False
        try:
            image = await self.build_image(record)
            if self.bound_values is not None:
                ref = AgentRef(record.id, record.name, record.project.id)
                values = await self.bound_values(principal, ref)
                if values:
                    await self.secret_port.set_keys(ref, values)
        except asyncio.CancelledError:
            raise
        except (BuildError, PlatformError) as exc:
            await self._finish_build(agent_id, build_id, ok=False, message=exc.message)
            return False
        except Exception as exc:  # noqa: BLE001 - any failure is the build's failure, shown in `message`
            log.exception("build of %s failed", record.name)
            await self._finish_build(agent_id, build_id, ok=False, message=f"build failed: {exc}")
            return False
        return await self._finish_build(agent_id, build_id, ok=True, image=image.reference)

    # == revisions ===================================================================================

    def _session_dir(self, record: AgentRecord) -> Path | None:
        """The directory of the agent's own session database (one per agent: its sandbox mounts only it)."""
        if self.settings.redis_url or self.mode == "memory":
            return None
        sessions = (Path(self.settings.data_dir) / "sessions").resolve()
        directory = sessions / f"{record.project.short}-{record.name}"
        directory.mkdir(parents=True, exist_ok=True)
        for suffix in ("", "-wal", "-shm"):  # a database of an earlier version sat beside the others
            earlier = sessions / f"{record.project.short}-{record.name}.sqlite3{suffix}"
            if earlier.is_file() and not (directory / f"sessions.sqlite3{suffix}").exists():
                earlier.replace(directory / f"sessions.sqlite3{suffix}")
        return directory

    def _session_store(self, record: AgentRecord) -> str:
        if self.settings.redis_url:
            return self.settings.redis_url
        directory = self._session_dir(record)
        if directory is None:
            return "memory"
        return f"sqlite:///{directory / 'sessions.sqlite3'}"

    def _revision_env(self, record: AgentRecord, secret_values: dict[str, str], workload_key: str | None) -> tuple[dict[str, str], dict[str, str]]:
        env = {k: str(v) for k, v in record.env.items()}
        env.update({
            "AGENT_NAME": record.name,
            "AGENT_IMAGE": record.image,
            "CAI_SESSION_STORE": self._session_store(record),
            "CAI_API_URL": self.settings.base_url or "",
            "CAI_PROJECT_ID": record.project.id,
            # The code sandbox, reached with the agent's own workload key (docs/codesandbox.md).
            "SANDBOX_URL": sandbox_url(self.settings.base_url, record.project.id),
            "PLATFORM_REQUEST_TIMEOUT_SECONDS": str(WORKLOAD_TOKEN_TTL_SECONDS),
        })
        for key, value in (("MODEL_BASE_URL", self.settings.model_base_url), ("MODEL_NAME", self.settings.model_name),
                           ("EMBED_BASE_URL", self.settings.embed_base_url)):
            if value:
                env[key] = value
        secret_env: dict[str, str] = {}
        if self.settings.model_api_key:
            secret_env["MODEL_API_KEY"] = self.settings.model_api_key
        if workload_key:
            secret_env["CAI_PROJECT_KEY"] = workload_key
        if self.settings.internal_token:
            secret_env["CAI_INTERNAL_TOKEN"] = workload_internal_token(self.settings.internal_token, record.workload.key)
        secret_env.update(secret_values)  # a per-agent MODEL_API_KEY overrides the platform default
        # The instance sees secrets as plain environment variables; their names (never values) tell the
        # harness which ones to leave out of `/debug/config`, which lists only non-secret config keys.
        env["CAI_SECRET_NAMES"] = ",".join(sorted(secret_env))
        return env, secret_env

    def _service_quota_sync(self, session: Session, project: Project) -> int:
        """The project's services quota (`services/service_quota.py`); 0 = unlimited."""
        return services_hard(project.settings)

    async def _roll(self, agent_id: str, reason: str, *, watch: bool = True, principal: Principal | None = None) -> bool:
        """Roll a new revision from the agent's current record. False when there is no image yet (the
        build under way rolls with the current values when it finishes)."""
        lock = self._roll_locks.setdefault(agent_id, asyncio.Lock())
        async with lock:
            now = self.clock.now()

            def allocate(session: Session) -> tuple[AgentRecord, str, int, dict[str, str], str | None, str, int, bool] | None:
                agent = session.get(Agent, agent_id)
                if agent is None or not agent.image:
                    return None
                project = self._project_sync(session, agent.project_id)
                agent.generation += 1
                revision = f"{agent.name}-{agent.generation:05d}"
                _, refusal = rules.exposure(agent.env or {})
                applied_before = session.scalar(
                    select(AgentRevision.name).where(AgentRevision.agent_id == agent_id, AgentRevision.reason == "").limit(1)
                ) is not None
                session.add(AgentRevision(
                    agent_id=agent_id, name=revision, generation=agent.generation, image=agent.image, created_at=now,
                    reason="ExposureRefused" if refusal else "", message=refusal,
                ))
                agent.latest_revision, agent.updated_at = revision, now
                if agent.build_claimed_at is not None:
                    pass  # a build is under way: it owns the state and rolls again when it finishes
                elif refusal:
                    agent.state, agent.message = "failed", refusal
                else:
                    agent.state, agent.message = "deploying", ""
                values = self._secret_values_sync(session, agent_id)
                return (AgentRecord.of(agent, project), revision, agent.generation, values, agent.workload_key, refusal,
                        self._service_quota_sync(session, project), applied_before)

            allocated = await self.db.run(allocate)
            if allocated is None:
                return False
            record, revision, generation, values, workload_key, refusal, hard, applied_before = allocated
            if refusal:
                self._unpublish(record)
                return True
            spec = self.revision_spec(record, revision, generation, values, workload_key, reason)
            # A first route counts against the project's services quota: check and apply in one turn
            # per project, so two new agents cannot both take the last place.
            try:
                async with self.quota.claim(record.project.id, record.project.namespace,
                                            0 if applied_before else hard):
                    try:
                        await self.runtime.apply(spec)
                    except WorkloadError as exc:
                        await self._set_state(agent_id, revision, "failed", exc.message)
                        return True
                    except Exception as exc:  # noqa: BLE001 - the rollout failed; the agent says why
                        log.exception("applying %s failed", revision)
                        await self._set_state(agent_id, revision, "failed", f"rolling out {revision} failed: {exc}")
                        return True
            except ServiceQuotaExceeded as exc:
                message = quota_message(exc.used, exc.hard)
                await self._set_state(agent_id, revision, "deploying", message)
                await self.db.run(lambda s: self._mark_revision_sync(s, agent_id, revision, "QuotaExceeded", message))
                return True
        if watch:
            self._spawn(agent_id, self._watch_latest(agent_id))
        return True

    def revision_spec(self, record: AgentRecord, revision: str, generation: int, values: dict[str, str],
                      workload_key: str | None, reason: str) -> RevisionSpec:
        """What the runtime runs for one revision of the agent as it is recorded now."""
        env, secret_env = self._revision_env(record, values, workload_key)
        return RevisionSpec(
            workload=record.workload, revision=revision, generation=generation, image=record.image,
            env=env, secret_env=secret_env, resources=self._resources(record.config),
            scaling=self._scaling(record.config),
            timeout_seconds=int(record.config.get("timeout_seconds") or 300),
            state_dirs=[str(d) for d in [self._session_dir(record)] if d is not None],
            labels={"cai.dev/agent": record.name, "cai.dev/reason": reason[:60]},
        )

    @staticmethod
    def _secret_values_sync(session: Session, agent_id: str) -> dict[str, str]:
        """The agent's secret values, with the platform's default model key unless it has its own."""
        values = {s.key: s.value for s in session.scalars(select(AgentSecret).where(AgentSecret.agent_id == agent_id))}
        platform_key = session.get(PlatformSetting, PLATFORM_MODEL_KEY_SETTING)
        if "MODEL_API_KEY" not in values and platform_key is not None and platform_key.value:
            values = {"MODEL_API_KEY": platform_key.value, **values}  # the platform default, set by an admin
        return values

    @staticmethod
    def _mark_revision_sync(session: Session, agent_id: str, revision: str, reason: str, message: str) -> None:
        row = session.get(AgentRevision, (agent_id, revision))
        if row is not None:
            row.reason, row.message = reason, message

    @staticmethod
    def _scaling(config: dict[str, Any]) -> Scaling:
        scaling = config.get("scaling") or {}
        defaults = Scaling()
        return Scaling(
            min_scale=scaling.get("min_scale", defaults.min_scale),
            max_scale=scaling.get("max_scale", defaults.max_scale),
            container_concurrency=scaling.get("container_concurrency", defaults.container_concurrency),
        )

    @staticmethod
    def _resources(config: dict[str, Any]) -> Resources:
        resources = config.get("resources") or {}
        return Resources(requests=dict(resources.get("requests") or {}), limits=dict(resources.get("limits") or {}))

    async def _set_state(self, agent_id: str, revision: str | None, state: str, message: str = "") -> bool:
        """Move the agent's state if `revision` is still its newest (a later roll wins)."""
        now = self.clock.now()

        def run(session: Session) -> bool:
            agent = session.get(Agent, agent_id)
            if agent is None or (revision is not None and agent.latest_revision != revision):
                return False
            if agent.build_claimed_at is not None:
                return False  # a newer build owns the state now
            agent.state, agent.message, agent.updated_at = state, message, now
            return True

        return await self.db.run(run)

    async def _watch_latest(self, agent_id: str) -> None:
        """Wait until the newest revision reports ready (agent ready) or not ready (agent failed)."""
        record = await self._record_by_id(agent_id)
        if record is None or not record.latest_revision:
            return
        revision = record.latest_revision
        held = await self.db.run(lambda s: (lambda r: r is not None and bool(r.reason))(s.get(AgentRevision, (agent_id, revision))))
        if held:
            return  # refused or waiting for quota: nothing will report on it
        lock = f"agent-watch:{agent_id}:{revision}"
        if not await self.locks.try_acquire(lock):
            return  # watched already, here or by another live replica
        try:
            await self._watch_revision(agent_id, revision)
        finally:
            await self.locks.release(lock)

    async def _watch_revision(self, agent_id: str, revision: str) -> None:
        loop_deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_SECONDS  # real time: instances start in it
        while True:
            current = await self._record_by_id(agent_id)
            if current is None or current.latest_revision != revision or current.state != "deploying":
                return
            status = await self._status(current)
            found = next((r for r in (status.revisions if status else []) if r.name == revision), None)
            if found is not None and found.state == "ready":
                await self._publish(current)  # before `ready`, so a caller who sees ready finds the host
                await self._set_state(agent_id, revision, "ready")
                return
            if found is not None and found.state == "not_ready" and found.reason not in ("", "Deploying", "ContainerCreating"):
                await self._set_state(agent_id, revision, "failed", found.message or found.reason)
                return
            if asyncio.get_running_loop().time() > loop_deadline:
                await self._set_state(agent_id, revision, "failed", f"revision {revision} did not become ready in {int(READY_TIMEOUT_SECONDS)} s")
                return
            await asyncio.sleep(READY_POLL_SECONDS)

    # == publishing ==================================================================================

    def _external_url(self, record: AgentRecord) -> str:
        host = self.hosts.host_for(record.name, record.project.short)
        port = ""
        if self.settings.base_url:
            from urllib.parse import urlsplit

            parsed = urlsplit(self.settings.base_url)
            if parsed.port:
                port = f":{parsed.port}"
        return f"http://{host}{port}"

    async def _publish(self, record: AgentRecord) -> None:
        mode, refusal = rules.exposure(record.env)
        host = self.hosts.host_for(record.name, record.project.short)
        if mode is None or refusal:
            self._unpublish(record)
            return
        ref, timeout = record.workload, float(record.config.get("timeout_seconds") or self.settings.invoke_timeout_seconds)
        target, hook = self._target_of(record), self.public_upstream

        async def upstream() -> Upstream:
            if hook is not None:
                return await hook(target)
            endpoint = await self.runtime.acquire(ref, timeout=timeout)
            return Upstream(endpoint.base_url, endpoint.release, timeout)

        self.hosts.register(host, upstream, self._host_guard(record, mode))
        url = self._external_url(record)
        if record.external_url != url:
            await self._store_external_url(record.id, url)

    def _host_guard(self, record: AgentRecord, mode: str) -> HostGuard:
        """The published address's gate: the auth mode (`apikey`: a platform key with access to the
        project; `jwt`: a token signed by the configured issuer's JWKS; `none`), then the rate budget.
        `GET /healthz` answers without a credential."""
        count, seconds = rules.rate_budget(record.env[rules.EXPOSE_RATE_LIMIT])
        limiter = TokenBucketLimiter(count / seconds, count, self.clock)
        budget = record.env[rules.EXPOSE_RATE_LIMIT].strip()
        jwks: list[Any] = []
        project_id = record.project.id

        def bearer(headers: dict[str, str]) -> str:
            scheme, _, token = headers.get("authorization", "").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else ""

        async def check_apikey(headers: dict[str, str]) -> Refusal | None:
            key = bearer(headers) or headers.get("x-api-key", "").strip()
            if not key:
                return 401, "this agent's public address requires an API key: send Authorization: Bearer <key>", {"WWW-Authenticate": "Bearer"}
            principal = await self.authenticate(key) if self.authenticate else None
            if principal is None or not principal.authenticated:
                return 401, "invalid or expired API key", {"WWW-Authenticate": "Bearer"}

            def visible(session: Session) -> bool:
                project = session.get(Project, project_id)
                return project is not None and self.access.grant_sync(session, principal, project).visible

            if not await self.db.run(visible):
                return 403, "this API key has no access to the agent's project", {}
            return None

        def verify_jwt(token: str) -> None:
            import jwt

            if not jwks:
                jwks.append(jwt.PyJWKClient(record.env[rules.EXPOSE_JWT_JWKS_URI].strip()))
            key = jwks[0].get_signing_key_from_jwt(token).key
            audiences = [a.strip() for a in record.env.get("CAI_EXPOSE_JWT_AUDIENCES", "").split(",") if a.strip()]
            jwt.decode(token, key, algorithms=["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"],
                       issuer=record.env[rules.EXPOSE_JWT_ISSUER].strip(), audience=audiences or None,
                       options={"verify_aud": bool(audiences)})

        async def check_jwt(headers: dict[str, str]) -> Refusal | None:
            token = bearer(headers)
            if not token:
                return 401, "this agent's public address requires a bearer JWT", {"WWW-Authenticate": "Bearer"}
            try:
                await anyio.to_thread.run_sync(verify_jwt, token)
            except Exception as exc:  # noqa: BLE001 - any verification failure is the caller's 401
                return 401, f"invalid token: {exc}", {"WWW-Authenticate": "Bearer"}
            return None

        async def guard(method: str, path: str, headers: dict[str, str]) -> Refusal | None:
            if not (method == "GET" and path == "/healthz"):
                if mode == "apikey":
                    refusal = await check_apikey(headers)
                elif mode == "jwt":
                    refusal = await check_jwt(headers)
                else:
                    refusal = None
                if refusal is not None:
                    return refusal
            wait = limiter.try_acquire("host")
            if wait is not None:
                return 429, f"this agent's public rate budget ({budget}) is used up; retry later", {
                    "Retry-After": str(max(1, math.ceil(wait)))}
            return None

        return guard

    async def _store_external_url(self, agent_id: str, url: str) -> None:
        def run(session: Session) -> None:
            agent = session.get(Agent, agent_id)
            if agent is not None:
                agent.external_url = url

        await self.db.run(run)

    def _unpublish(self, record: AgentRecord) -> None:
        self.hosts.unregister(self.hosts.host_for(record.name, record.project.short))
        if record.external_url:
            self._spawn(record.id, self._store_external_url(record.id, ""))

    # == list, get, delete ===========================================================================

    async def list(self, principal: Principal, project: str | None, page_size: Any, page_token: str | None) -> dict[str, Any]:
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
        return page_body("agents", Page(views, page.next_page_token, page.extra))

    async def get(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        return await self.view(await self._locate(principal, name, project))

    async def delete(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
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
        return {"agent": record.name, "deleted": True}

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

    async def unowned_agents(self) -> builtins.list[dict[str, Any]]:
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

    # == env and secrets =============================================================================

    @staticmethod
    def _set_remove(body: Any) -> tuple[dict[str, Any], builtins.list[Any]]:
        if not isinstance(body, dict):
            raise BadRequest(NOTHING_TO_DO)
        set_ = body.get("set")
        remove = body.get("remove")
        if set_ is not None and not isinstance(set_, dict):
            raise BadRequest("'set' must be an object mapping names to values")
        if remove is not None and not isinstance(remove, list):
            raise BadRequest("'remove' must be an array of names")
        if not set_ and not remove:
            raise BadRequest(NOTHING_TO_DO)
        return set_ or {}, remove or []

    @staticmethod
    def _value(key: str, value: Any, what: str) -> str:
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str | int | float):
            return str(value)
        raise BadRequest(f"{what} values must be strings: {key}")

    async def get_env(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        return {"agent": record.name, "env": record.env}

    async def patch_env(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        set_, remove = self._set_remove(body)
        for key in [*set_, *remove]:
            if not isinstance(key, str) or not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))
        values = {k: self._value(k, v, "env") for k, v in set_.items()}

        def run(session: Session) -> dict[str, str]:
            agent = self._agent_sync(session, record)
            env = dict(agent.env or {})
            for key in remove:
                env.pop(key, None)
            for key, value in values.items():
                if value == "":
                    env.pop(key, None)
                else:
                    env[key] = value
            agent.env, agent.updated_at = env, self.clock.now()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name,
                              {"env_set": sorted(values), "env_remove": sorted(remove)})
            return env

        env = await self.db.run(run)
        await self._roll(record.id, "env")
        return {"agent": record.name, "env_updated": True, "env": env}

    async def secret_keys(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        keys = await self.db.run(lambda s: sorted(s.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id))))
        return {"agent": record.name, "keys": keys}

    def _check_secret_map(self, values: Any) -> dict[str, str]:
        if not isinstance(values, dict):
            raise BadRequest("the body must be a JSON object mapping secret keys to values")
        checked: dict[str, str] = {}
        for key, value in values.items():
            if not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))
            checked[key] = self._value(key, value, "secret")
        return checked

    async def put_secrets(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        values = {k: v for k, v in self._check_secret_map(body).items() if v != ""}

        def run(session: Session) -> None:
            session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id))
            for key, value in values.items():
                session.add(AgentSecret(agent_id=record.id, key=key, value=value))
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"secrets_replaced": sorted(values)})

        await self.db.run(run)
        await self._roll(record.id, "secrets")
        return {"agent": record.name, "secrets_updated": True}

    async def patch_secrets(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        set_, remove = self._set_remove(body)
        values = self._check_secret_map(set_)
        for key in remove:
            if not isinstance(key, str) or not ENV_NAME.match(key):
                raise BadRequest(invalid_key(key))

        def run(session: Session) -> list[str]:
            drop = set(remove) | {k for k, v in values.items() if v == ""}
            if drop:
                session.execute(delete(AgentSecret).where(AgentSecret.agent_id == record.id, AgentSecret.key.in_(drop)))
            for key, value in values.items():
                if value != "":
                    session.merge(AgentSecret(agent_id=record.id, key=key, value=value))
            session.flush()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name,
                              {"secrets_set": sorted(k for k, v in values.items() if v), "secrets_remove": sorted(drop)})
            return sorted(session.scalars(select(AgentSecret.key).where(AgentSecret.agent_id == record.id)))

        keys = await self.db.run(run)
        await self._roll(record.id, "secrets")
        return {"agent": record.name, "secrets_updated": True, "keys": keys}

    # == config ======================================================================================

    async def get_config(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        return {"agent": record.name, "config": record.config or None}

    async def patch_config(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        merged = rules.merge_config(record.config, body)

        def run(session: Session) -> None:
            agent = self._agent_sync(session, record)
            agent.config, agent.updated_at = merged, self.clock.now()
            self.audit.record(session, record.project.id, principal, "agent.config", record.name, {"config": merged})

        await self.db.run(run)
        await self._roll(record.id, "config")
        return {"agent": record.name, "config_updated": True, "config": merged or None}

    # == revisions and traffic =======================================================================

    async def revisions(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        rows = await self.db.run(lambda s: [
            (r.name, r.generation, r.image, r.created_at, r.reason, r.message)
            for r in s.scalars(select(AgentRevision).where(AgentRevision.agent_id == record.id).order_by(AgentRevision.generation.desc()))
        ])
        status = await self._status(record)
        live: dict[str, RevisionStatus] = {r.name: r for r in (status.revisions if status else [])}
        out = []
        for rev_name, generation, image, created_at, reason, message in rows:
            body: dict[str, Any] = {"name": rev_name, "generation": generation}
            running = live.get(rev_name)
            if running is not None and not reason:
                body.update({
                    "traffic_percent": running.traffic_percent, "created_at": rfc3339(created_at),
                    "ready": running.ready, "state": running.state, "reason": running.reason,
                    "message": running.message, "replicas": running.replicas, "image": running.image or image,
                    "url": running.url or f"http://{rev_name}.{record.project.namespace}.svc.cluster.local",
                })
                if running.tag:
                    body["tag"] = running.tag
            else:
                body.update({
                    "traffic_percent": 0, "created_at": rfc3339(created_at), "ready": False,
                    "state": "not_ready" if reason else "unknown", "reason": reason, "message": message,
                    "replicas": 0, "image": image, "url": "",
                })
            out.append(body)
        return {"agent": record.name, "revisions": out}

    async def set_traffic(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        split = body.get("traffic") if isinstance(body, dict) else None
        if not isinstance(split, list) or not split:
            raise BadRequest(TRAFFIC_REQUIRED)
        targets: list[TrafficTarget] = []
        seen: set[str] = set()
        for entry in split:
            if not isinstance(entry, dict) or not isinstance(entry.get("revision_name"), str) or not entry["revision_name"]:
                raise BadRequest(f"{TRAFFIC_REQUIRED} (every entry needs revision_name and percent)")
            percent = entry.get("percent")
            if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
                raise BadRequest(f"{TRAFFIC_REQUIRED} (percent must be an integer from 0 to 100)")
            if entry["revision_name"] in seen:
                raise BadRequest(f"{TRAFFIC_REQUIRED} (revision {entry['revision_name']} appears twice)")
            seen.add(entry["revision_name"])
            targets.append(TrafficTarget(percent=percent, revision_name=entry["revision_name"]))
        total = sum(t.percent for t in targets)
        if total != 100:
            raise BadRequest(f"{TRAFFIC_REQUIRED} (percentages must sum to exactly 100, got {total})")
        runnable = await self.db.run(lambda s: set(s.scalars(
            select(AgentRevision.name).where(AgentRevision.agent_id == record.id, AgentRevision.reason == "")
        )))
        for target in targets:
            if target.revision_name not in runnable:
                raise BadRequest(f"revision {target.revision_name} does not exist for this agent")
        try:
            await self.runtime.set_traffic(record.workload, targets)
        except WorkloadError as exc:
            raise BadRequest(exc.message) from None
        traffic = [{"revision_name": t.revision_name, "percent": t.percent} for t in targets]
        await self.db.run(lambda s: self.audit.record(s, record.project.id, principal, "agent.set-traffic", record.name, {"traffic": traffic}))
        return {"agent": record.name, "traffic": traffic}

    # == spec and metrics ============================================================================

    async def spec(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        import yaml

        record = await self._locate(principal, name, project)
        document = await self.runtime.spec_document(record.workload)
        if document is None:
            document = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                        "metadata": {"name": record.name, "namespace": record.project.namespace}, "status": {"ready": False}}
        text = yaml.safe_dump(sanitize_spec(document), sort_keys=False, default_flow_style=False)
        return {"agent": record.name, "yaml": text, "note": SPEC_NOTE}

    async def metrics(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        metrics = await self.runtime.metrics(record.workload)
        status = await self._status(record)
        revisions = metrics.revisions if metrics else (status.revisions if status else [])
        return {
            "agent": record.name,
            "instances": metrics.instances if metrics else 0,
            "revisions": [
                {"name": r.name, "ready": r.ready, "state": r.state, "replicas": r.replicas, "traffic_percent": r.traffic_percent}
                for r in revisions
            ],
            "readiness": record.state,
            "latest_ready_revision": status.latest_ready_revision if status else "",
            "target_concurrency": metrics.target_concurrency if metrics else 0,
            "note": METRICS_NOTE,
        }

    # == logs ========================================================================================

    async def logs(self, principal: Principal, name: str, project: str | None, *, follow: bool = False, tail: int = 500) -> AsyncIterator[str]:
        record = await self._locate(principal, name, project)
        lines = self.runtime.logs(record.workload, tail=tail, follow=follow)
        if lines is None:
            return _single(
                f"agent {record.name} has no live pods right now (it scaled to zero or is not running); "
                f"read persisted logs at GET /v1/agents/{record.name}/logs/history\n"
            )
        return _with_newlines(lines)

    def _retention(self) -> timedelta:
        text = (self.settings.log_retention or "336h").strip()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        try:
            return timedelta(seconds=float(text[:-1]) * units[text[-1]])
        except (KeyError, ValueError, IndexError):
            return timedelta(days=14)

    async def log_history(self, principal: Principal, name: str, project: str | None, limit: Any, since: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        if limit in (None, ""):
            count = LOG_HISTORY_DEFAULT
        else:
            try:
                count = int(limit)
            except (TypeError, ValueError):
                raise BadRequest("limit must be a positive integer") from None
            if count < 1:
                raise BadRequest("limit must be a positive integer")
        floor = self.clock.now() - self._retention()
        if since not in (None, ""):
            try:
                parsed = datetime.fromisoformat(str(since).replace("Z", "+00:00").replace(" ", "+"))
            except ValueError:
                raise BadRequest("since must be an RFC 3339 timestamp, e.g. 2026-01-01T00:00:00Z") from None
            if parsed.tzinfo is None:
                raise BadRequest("since must be an RFC 3339 timestamp, e.g. 2026-01-01T00:00:00Z")
            floor = max(floor, parsed)
        lines = await self.runtime.log_history(record.workload, since=floor, limit=count)
        body = [
            {"ts": rfc3339(line.ts), "revision": line.revision, "pod": line.pod, "stream": line.stream, "message": line.message}
            for line in lines if line.ts >= floor
        ]
        return {"agent": record.name, "lines": body, "count": len(body),
                "note": HISTORY_NOTE.format(retention=self.settings.log_retention)}

    # == stored source files =========================================================================

    async def list_files(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        rows = await self.db.run(lambda s: [
            {"path": f.path, "size": f.size, "updated_at": rfc3339(f.updated_at)}
            for f in s.scalars(select(AgentFile).where(AgentFile.agent_id == record.id).order_by(AgentFile.path))
        ])
        return {"agent": record.name, "agent_id": record.id, "files": rows, "editable": True, "note": FILES_NOTE}

    async def read_file(self, principal: Principal, name: str, project: str | None, path: str) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        row = await self.db.run(lambda s: (lambda f: None if f is None else (f.content, f.updated_at))(s.get(AgentFile, (record.id, clean))))
        if row is None:
            raise NotFound(f"file {clean} not found")
        content, updated_at = row
        return {"path": clean, "content": content.decode("utf-8", errors="replace"), "updated_at": rfc3339(updated_at)}

    async def write_file(self, principal: Principal, name: str, project: str | None, path: str, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)
        content = body.get("content") if isinstance(body, dict) else None
        if not isinstance(content, str):
            raise BadRequest("'content' is required and must be a string")
        data = content.encode()
        now = self.clock.now()

        def run(session: Session) -> None:
            files = {f.path: f.content for f in session.scalars(select(AgentFile).where(AgentFile.agent_id == record.id))}
            files[clean] = data
            agent_source.check_limits(files)
            session.merge(AgentFile(agent_id=record.id, path=clean, content=data, size=len(data), updated_at=now))
            self.audit.record(session, record.project.id, principal, "agent.file.write", f"{record.name}/{clean}", {"bytes": len(data)})

        await self.db.run(run)
        return {"path": clean, "bytes": len(data), "note": FILE_NOTE.format(name=record.name)}

    async def delete_file(self, principal: Principal, name: str, project: str | None, path: str) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        clean = agent_source.clean_path(path)

        def run(session: Session) -> None:
            row = session.get(AgentFile, (record.id, clean))
            if row is None:
                raise NotFound(f"file {clean} not found")
            session.delete(row)
            self.audit.record(session, record.project.id, principal, "agent.file.delete", f"{record.name}/{clean}")

        await self.db.run(run)
        return {"deleted": clean}

    # == embed config ================================================================================

    @staticmethod
    def _embed_view(embed: dict[str, Any] | None) -> dict[str, Any]:
        return {**rules.embed_defaults(), **(embed or {})}

    async def get_embed(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        return {"agent": record.name, **self._embed_view(record.embed)}

    async def put_embed(self, principal: Principal, name: str, project: str | None, body: Any) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        merged = rules.merge_embed(record.embed, body)
        now = self.clock.now()

        def run(session: Session) -> dict[str, Any]:
            agent = self._agent_sync(session, record)
            if not merged.get("embed_key"):
                merged["embed_key"] = _embed_key()
            merged["updated_at"] = rfc3339(now)
            agent.embed, agent.embed_key = merged, merged["embed_key"]
            self.audit.record(session, record.project.id, principal, "agent.embed.update", record.name,
                              {k: v for k, v in merged.items() if k != "embed_key"})
            return merged

        embed = await self.db.run(run)
        return {"agent": record.name, **self._embed_view(embed)}

    async def delete_embed(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)

        def run(session: Session) -> None:
            agent = self._agent_sync(session, record)
            agent.embed, agent.embed_key = None, None
            self.audit.record(session, record.project.id, principal, "agent.embed.delete", record.name)

        await self.db.run(run)
        return {"agent": record.name, "deleted": True}

    async def rotate_embed_key(self, principal: Principal, name: str, project: str | None) -> dict[str, Any]:
        record = await self._locate(principal, name, project)
        now = self.clock.now()

        def run(session: Session) -> dict[str, Any]:
            agent = self._agent_sync(session, record)
            embed = {**rules.embed_defaults(), **(agent.embed or {})}
            embed["embed_key"], embed["updated_at"] = _embed_key(), rfc3339(now)
            agent.embed, agent.embed_key = embed, embed["embed_key"]
            self.audit.record(session, record.project.id, principal, "agent.embed.rotate-key", record.name)
            return embed

        embed = await self.db.run(run)
        return {"agent": record.name, **self._embed_view(embed)}

    # == AgentDirectory (for the invoke path) ========================================================

    @staticmethod
    def _target_of(record: AgentRecord) -> InvokeTarget:
        return InvokeTarget(
            agent=record.name, agent_id=record.id, project_id=record.project.id, project_short=record.project.short,
            kind=record.kind, framework=record.framework, workload=record.workload,
        )

    def _target(self, agent: Agent, project: Project) -> InvokeTarget:
        return InvokeTarget(
            agent=agent.name, agent_id=agent.id, project_id=project.id, project_short=project.short,
            kind=agent.kind, framework=agent.framework,
            workload=WorkloadRef(project.id, project.short, agent.name, agent.kind),
        )

    async def invoke_target(self, principal: Principal, name: str, project: str | None) -> InvokeTarget:
        validation.agent_name(name)

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
            if not found:
                raise NotFound(unknown_agent(name))
            if len(found) > 1:
                raise Conflict(f"agent {name} exists in several projects; add ?project=<slug> or sign in")
            return self._target(*found[0])

        return await self.db.run(run)

    async def manage_target(self, principal: Principal, name: str, project: str | None) -> InvokeTarget:
        self.access.require_management(principal)

        def run(session: Session) -> InvokeTarget:
            agent, proj, _ = self._locate_sync(session, principal, name, project)
            return self._target(agent, proj)

        return await self.db.run(run)

    async def embed_target(self, key: str) -> EmbedTarget | None:
        def run(session: Session) -> EmbedTarget | None:
            if not key:
                return None
            agent = session.scalar(select(Agent).where(Agent.embed_key == key))
            if agent is None or not (agent.embed or {}).get("enabled"):
                return None
            config = self._embed_view(agent.embed)
            project = session.get(Project, agent.project_id)
            if project is None:
                return None
            return EmbedTarget(self._target(agent, project), config,
                               list(config.get("allowed_origins") or []))

        return await self.db.run(run)


def _embed_key() -> str:
    return "emb_" + pysecrets.token_urlsafe(24)


async def _single(text: str) -> AsyncIterator[str]:
    yield text


async def _with_newlines(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    async for line in lines:
        yield line if line.endswith("\n") else line + "\n"


class AgentSecretsOnTables(AgentSecrets):
    """The agent-secret port on the agents area's tables: bindings reach real agents and roll them."""

    def __init__(self, service: AgentService):
        self.service = service

    @property
    def db(self) -> Database:
        return self.service.db

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
                session.merge(AgentSecret(agent_id=agent.id, key=key, value=value))

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
        return await self.service._roll(agent.id, reason)


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
