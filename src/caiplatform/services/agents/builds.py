"""Building agents: deploy from a tarball, redeploy from the stored source, the build claim and its
takeover after a replica dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio.to_thread
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform import json_input, security
from caiplatform.db import new_id
from caiplatform.db.models import ApiKey, Project
from caiplatform.db.models.agents import Agent, AgentBuild, AgentFile, AgentRevision
from caiplatform.domain import agent_source
from caiplatform.domain import agents as rules
from caiplatform.errors import BadRequest, Conflict, Forbidden, PlatformError
from caiplatform.models.agents import DeployAccepted, RedeployAccepted
from caiplatform.ports.agent_secrets import AgentRef
from caiplatform.ports.builder import BuildError, BuildLog, BuildRequest, Image, truncate_build_message
from caiplatform.principal import Principal
from caiplatform.redaction import without_paths
from caiplatform.services.agents.records import (
    BUILD_CLAIM_TTL,
    BUILD_TAKEOVER_SECONDS,
    DEPLOY_NOTE,
    NO_MODEL_ENDPOINT_NOTE,
    NO_SOURCE,
    REDEPLOY_NOTE,
    AgentRecord,
    DeployUpload,
    build_in_progress,
    build_lock,
    owner_ref_of,
    quota_message,
)
from caiplatform.services.agents.rollout import AgentRollout
from caiplatform.services.service_quota import ServiceQuotaExceeded
from caiplatform.validation import AGENT_NAME

log = logging.getLogger(__name__)


class AgentBuilds(AgentRollout):
    """Deploy and redeploy: the build claim, the build under its work lock, taking over orphaned builds."""

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

    # == deploy ======================================================================================

    async def deploy(self, principal: Principal, project: str | None, upload: DeployUpload) -> DeployAccepted:
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

    async def redeploy(self, principal: Principal, name: str, project: str | None) -> RedeployAccepted:
        record = await self._locate(principal, name, project)
        count = await self.db.run(lambda s: len(list(s.scalars(select(AgentFile.path).where(AgentFile.agent_id == record.id)))))
        if count == 0:
            raise BadRequest(NO_SOURCE)
        result = await self._claim_and_build(
            principal, record.project.id, record.name, None, framework=record.framework, runtime=record.runtime,
            kind=record.kind, config=None,
        )
        note = REDEPLOY_NOTE.format(name=record.name)
        if result.note is not None:  # the model endpoint is missing: the redeploy says so too
            note += "; " + NO_MODEL_ENDPOINT_NOTE
        return RedeployAccepted(agent=result.agent, build_id=result.build_id, files=count, note=note)

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
    ) -> DeployAccepted:
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
        if self._lacks_model_endpoint(framework, env):
            return DeployAccepted(agent=name, build_id=build_id,
                                  note=DEPLOY_NOTE.format(name=name) + "; " + NO_MODEL_ENDPOINT_NOTE)
        return DeployAccepted(agent=name, build_id=build_id)

    def _replace_files_sync(self, session: Session, agent_id: str, files: dict[str, bytes], now: datetime) -> None:
        session.execute(delete(AgentFile).where(AgentFile.agent_id == agent_id))
        for path, content in files.items():
            session.add(AgentFile(agent_id=agent_id, path=path, content=content, size=len(content), updated_at=now))

    async def _finish_build(self, agent_id: str, build_id: str, *, ok: bool, message: str = "", image: str = "",
                            began: float | None = None) -> bool:
        """Record a build's end and release the claim; False when the claim is no longer ours. `began`:
        when this replica started building (`time.monotonic()`), for cai_build_duration_seconds."""
        self.prometheus.observe_build("succeeded" if ok else "failed",
                                   None if began is None else time.monotonic() - began)
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

    async def build_image(self, record: AgentRecord, log: BuildLog | None = None) -> Image:
        """The image of the agent's stored sources, from this replica's builder (the same sources give
        the same image reference on every replica). `log` takes the build's lines as they come."""
        files = await self.db.run(
            lambda s: {f.path: f.content for f in s.scalars(select(AgentFile).where(AgentFile.agent_id == record.id))}
        )
        with tempfile.TemporaryDirectory(prefix=f"cai-build-{record.name}-") as tmp:
            agent_source.write_tree(files, Path(tmp))
            return await self.builder.build(BuildRequest(
                project_id=record.project.id, project_short=record.project.short, workload=record.name,
                framework=record.framework, source_dir=Path(tmp), runtime=record.runtime,
            ), log)

    async def _build(self, agent_id: str, build_id: str, principal: Principal | None) -> bool:
        """Build the image and record the end of the build; True when the agent should roll it out."""
        record = await self._record_by_id(agent_id)
        if record is None:
            return False
        began = time.monotonic()
        writer = BuildLogWriter(self.db, build_id)
        try:
            try:
                image = await self.build_image(record, writer.line)
            finally:
                await writer.close()  # every line is stored before the build's end is
            if self.bound_values is not None:
                ref = AgentRef(record.id, record.name, record.project.id)
                values = await self.bound_values(principal, ref)
                if values:
                    await self.secret_port.set_keys(ref, values)
        except asyncio.CancelledError:
            raise
        except (BuildError, PlatformError) as exc:
            await self._finish_build(agent_id, build_id, ok=False, message=exc.message, began=began)
            return False
        except Exception as exc:  # noqa: BLE001 - any failure is the build's failure, shown in `message`
            log.exception("build of %s failed", record.name)
            await self._finish_build(agent_id, build_id, ok=False, message=f"build failed: {exc}", began=began)
            return False
        return await self._finish_build(agent_id, build_id, ok=True, image=image.reference, began=began)


#: how much of a build's log is kept (a tenant's build step writes what it likes); past it one line says so
BUILD_LOG_LIMIT = 256 * 1024
BUILD_LOG_TRUNCATED = "... (the build log is longer than 256 KiB: the rest is not kept)\n"
#: how often the lines a build wrote are stored (a reader following the log sees them that late at most)
BUILD_LOG_FLUSH_SECONDS = 0.25


class BuildLogWriter:
    """A build's log lines into `agent_builds.log`, in batches (one write per flush, not per line), with
    server paths cut (`without_paths`) and the whole kept under `BUILD_LOG_LIMIT`."""

    def __init__(self, db: Any, build_id: str):
        self.db = db
        self.build_id = build_id
        self._pending: list[str] = []
        self._size = 0
        self._full = False
        self._wake = asyncio.Event()
        self._closed = False
        self._task = asyncio.get_running_loop().create_task(self._flusher())

    def line(self, text: str) -> None:
        if self._full:
            return
        for part in without_paths(str(text)).splitlines() or [""]:
            entry = part + "\n"
            if self._size + len(entry) > BUILD_LOG_LIMIT:
                self._pending.append(BUILD_LOG_TRUNCATED)
                self._full = True
                break
            self._pending.append(entry)
            self._size += len(entry)
        self._wake.set()

    async def _write(self) -> None:
        if not self._pending:
            return
        text, self._pending = "".join(self._pending), []

        def run(session: Session) -> None:
            build = session.get(AgentBuild, self.build_id)
            if build is not None:
                build.log = (build.log or "") + text

        await self.db.run(run)

    async def _write_safely(self) -> None:
        try:
            await self._write()
        except Exception:  # noqa: BLE001 - the log is a view of the build: its loss never fails the build
            log.warning("agents: storing build %s's log lines failed", self.build_id, exc_info=True)

    async def _flusher(self) -> None:
        # One write at a time (two would race to append); `close` lets the last one finish.
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._write_safely()
            if self._closed:
                return
            await asyncio.sleep(BUILD_LOG_FLUSH_SECONDS)

    async def close(self) -> None:
        """Store what is left; the lines are all stored when it returns."""
        self._closed = True
        self._wake.set()
        with contextlib.suppress(Exception):
            await self._task
        await self._write_safely()
