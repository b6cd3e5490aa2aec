"""Revisions of an agent: the revision spec and its env contract, rolling, readiness, traffic, spec and
metrics.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform.clock import rfc3339
from caiplatform.db.models import PlatformSetting, Project
from caiplatform.db.models.agents import Agent, AgentRevision, AgentSecret
from caiplatform.domain import agents as rules
from caiplatform.domain.spec_document import sanitize_spec
from caiplatform.errors import BadRequest
from caiplatform.models.agents import AgentMetrics, AgentSpec, RevisionList, TrafficSet, TrafficSplit
from caiplatform.ports.agent_secrets import AgentSecrets
from caiplatform.ports.runtime import (
    Resources,
    RevisionSpec,
    RevisionStatus,
    Scaling,
    TrafficTarget,
    WorkloadError,
)
from caiplatform.principal import Principal
from caiplatform.services.agents.publishing import AgentPublishing
from caiplatform.services.agents.records import (
    METRICS_NOTE,
    PLATFORM_MODEL_KEY_SETTING,
    READY_POLL_SECONDS,
    READY_TIMEOUT_SECONDS,
    SPEC_NOTE,
    WORKLOAD_TOKEN_TTL_SECONDS,
    AgentRecord,
    quota_message,
    sandbox_url,
)
from caiplatform.services.service_quota import ServiceQuotaExceeded, services_hard
from caiplatform.turns.browse import workload_internal_token

log = logging.getLogger(__name__)


class AgentRollout(AgentPublishing):
    """Rolling immutable revisions, watching them become ready, the traffic split, spec and metrics."""

    @functools.cached_property
    def secret_port(self) -> AgentSecrets:
        """The agent-secret port on this service's tables (bindings write into it and roll)."""
        if self.secret_tables is None:
            raise RuntimeError("the agents service was built without its agent-secret tables (secret_tables)")
        return self.secret_tables(self.db, self._roll)

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
            if self.session_access is not None:
                return str(self.session_access.store_url(record.project.id, record.name))
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
        store = self._session_store(record)
        # A Valkey URL carries the agent's own user and password: a secret, like the others.
        (secret_env if "@" in store else env)["CAI_SESSION_STORE"] = store
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
            await self.ensure_session_user(record)
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

    async def ensure_session_users(self) -> None:
        """Every agent's Valkey user (server mode), at start."""
        if self.session_access is None:
            return

        def read(session: Session) -> list[tuple[str, str]]:
            return [(a.project_id, a.name) for a in session.scalars(select(Agent))]

        for project_id, name in await self.db.run(read):
            await self.session_access.ensure(project_id, name)

    async def ensure_session_user(self, record: AgentRecord) -> None:
        """Server mode: the agent's Valkey user exists before an instance signs in with it."""
        if self.session_access is not None:
            await self.session_access.ensure(record.project.id, record.name)

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

    def _secret_values_sync(self, session: Session, agent_id: str) -> dict[str, str]:
        """The agent's secret values (opened: they are sealed in the database), with the platform's default
        model key unless it has its own."""
        values = {s.key: self.db.open_secret(s.value)
                  for s in session.scalars(select(AgentSecret).where(AgentSecret.agent_id == agent_id))}
        platform_key = session.get(PlatformSetting, PLATFORM_MODEL_KEY_SETTING)
        if "MODEL_API_KEY" not in values and platform_key is not None and platform_key.value:
            # the platform default, set by an admin (sealed like agents' secrets)
            values = {"MODEL_API_KEY": self.db.open_secret(platform_key.value), **values}
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

    # == revisions and traffic =======================================================================

    async def revisions(self, principal: Principal, name: str, project: str | None) -> RevisionList:
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
        return RevisionList.of({"agent": record.name, "revisions": out})

    async def set_traffic(self, principal: Principal, name: str, project: str | None, split: TrafficSplit) -> TrafficSet:
        record = await self._locate(principal, name, project)
        targets = [TrafficTarget(percent=share.percent, revision_name=share.revision_name) for share in split.traffic]
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
        return TrafficSet.of({"agent": record.name, "traffic": traffic})

    # == spec and metrics ============================================================================

    async def spec(self, principal: Principal, name: str, project: str | None) -> AgentSpec:
        import yaml

        record = await self._locate(principal, name, project)
        document = await self.runtime.spec_document(record.workload)
        if document is None:
            document = {"apiVersion": "serving.knative.dev/v1", "kind": "Service",
                        "metadata": {"name": record.name, "namespace": record.project.namespace}, "status": {"ready": False}}
        text = yaml.safe_dump(sanitize_spec(document), sort_keys=False, default_flow_style=False)
        return AgentSpec(agent=record.name, yaml=text, note=SPEC_NOTE)

    async def metrics(self, principal: Principal, name: str, project: str | None) -> AgentMetrics:
        record = await self._locate(principal, name, project)
        metrics = await self.runtime.metrics(record.workload)
        status = await self._status(record)
        revisions = metrics.revisions if metrics else (status.revisions if status else [])
        return AgentMetrics.of({
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
        })
