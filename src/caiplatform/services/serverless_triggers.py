"""Triggers (document 3): fire a service of the same project without an inbound call.

- `schedule`: five-field cron in `time_zone` (croniter), fired by the platform's scheduler task. Each
  occurrence is claimed by inserting its run row (unique per trigger and occurrence), so several
  server replicas sharing one database fire it once. The payload is POSTed verbatim to `target.path`.
  The claimer holds the run's work lock (`caiplatform.worklocks`) until the run is recorded finished;
  a `running` run whose lock nobody holds was claimed by a replica that died, and the next scheduler
  tick of any replica fires it again.
- `pubsub`: the platform creates a push subscription on the topic whose URL is the trigger's
  `delivery_url`; the messaging area delivers each message there as a CloudEvent, and
  `ServerlessService.resolve_internal` (through `caiplatform.web.internal_transport`) routes that private hostname to
  the runtime. The messaging side is reached through the small `PushSubscriptions` hook.
- `objectstore`: polls a bucket, a directory `<buckets-root>/<project-short>/<bucket>` (the data dir's
  `buckets/` for the embedded platform), and fires once per new or changed object (one modified after
  the trigger became ready), claimed by its run row like a schedule occurrence.

A target is a serverless service, or an agent or function found through the `WorkloadFinder` hook the
agents area provides. This module reads and changes triggers; how they are set up and fire (the
scheduler, bucket polling, runs) is its layer `TriggerRuns` in `serverless_trigger_runs.py`.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, cast

import anyio.to_thread
from sqlalchemy import Table, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.db.models.serverless import ServerlessTrigger as TriggerRow
from caiplatform.db.models.serverless import ServerlessTriggerRun as RunRow
from caiplatform.domain.serverless import TRIGGER_NAME_TAKEN, TRIGGER_NOT_FOUND
from caiplatform.domain.serverless_triggers import parse_source, parse_target, require_invoke_body
from caiplatform.errors import BadRequest, Conflict, NotFound
from caiplatform.models import serverless as models
from caiplatform.models.messaging import SubscriptionCreate
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.runtime import WorkloadRef, WorkloadRuntime
from caiplatform.principal import Principal
from caiplatform.services.access import ProjectRef
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each
from caiplatform.services.serverless_trigger_runs import TriggerRuns, subscription_name
from caiplatform.worklocks import LocalWorkLocks

log = logging.getLogger(__name__)

AGENT_PATHS = ("/invoke", "/invoke/stream")
RUNS_SHOWN = 50


class PushSubscriptions(Protocol):
    """What a pubsub trigger needs from the messaging area (wired by the platform)."""

    async def ensure_push_subscription(self, project_id: str, topic: str, subscription: str, push_url: str,
                                       content_mode: str) -> None:
        """Create (or keep) a push subscription on `topic`. Raises `NotFound` for an unknown topic."""
        ...

    async def delete_push_subscription(self, project_id: str, topic: str, subscription: str) -> None:
        """Remove it; idempotent."""
        ...


class TopicPushSubscriptions:
    """`PushSubscriptions` over the messaging area's `TopicService` (`create_subscription`,
    `delete_subscription`), acting as the platform itself."""

    def __init__(self, topics: Any):
        self.topics = topics

    async def ensure_push_subscription(self, project_id: str, topic: str, subscription: str, push_url: str,
                                       content_mode: str) -> None:
        body = {"name": subscription, "deliver": {"mode": "push", "push": {"url": push_url,
                                                                             "content_mode": content_mode}}}
        try:
            await self.topics.create_subscription(Principal.internal(), project_id, topic,
                                                  SubscriptionCreate.parse(body))
        except Conflict as exc:
            if "already exists" not in exc.message:  # not ready yet, budget, ...: the trigger stays pending
                raise

    async def delete_push_subscription(self, project_id: str, topic: str, subscription: str) -> None:
        try:
            await self.topics.delete_subscription(Principal.internal(), project_id, topic, subscription)
        except NotFound:
            pass


#: (project_id, name) → (the workload of an agent or function named so, its kind) or None.
WorkloadFinder = Callable[[str, str], Awaitable[tuple[WorkloadRef, str] | None]]
ProjectResolver = Callable[[Principal, str], Awaitable[ProjectRef]]


def directory_finder(directory: Any) -> WorkloadFinder:
    """A `WorkloadFinder` over the agents area's `AgentDirectory` (agents and functions by name)."""

    async def find(project_id: str, name: str) -> tuple[WorkloadRef, str] | None:
        try:
            target = await directory.invoke_target(Principal.internal(), name, project_id)
        except NotFound:
            return None
        if target.project_id != project_id:
            return None
        return target.workload, target.kind

    return find


class TriggerService(TriggerRuns):
    def __init__(
        self,
        db: Database,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        runtime: WorkloadRuntime,
        project: ProjectResolver,
        *,
        find_workload: WorkloadFinder | None = None,
        pubsub: PushSubscriptions | None = None,
        buckets_root: Path | None = None,
        acquire_timeout: float = 60.0,
    ):
        self.db = db
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.runtime = runtime
        self._project = project
        self.find_workload = find_workload
        self.pubsub = pubsub
        self.buckets_root = buckets_root
        self.acquire_timeout = acquire_timeout
        self._polled_at: float | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._scheduler: asyncio.Task[None] | None = None
        # Replaced by the platform with locks shared through its database (several replicas).
        self.locks: Any = LocalWorkLocks()

    # ------------------------------------------------------------------------------------ parsing

    async def _target_kind(self, project: ProjectRef, service: str) -> str:
        """`service` for a serverless service, else the agent/function kind; 400 when none exists."""
        exists = await self.db.run(lambda s: s.scalar(
            select(ServiceRow.id).where(ServiceRow.project_id == project.id, ServiceRow.name == service)))
        if exists is not None:
            return "service"
        if self.find_workload is not None:
            found = await self.find_workload(project.id, service)
            if found is not None:
                return found[1]
        raise BadRequest(f"target.service {service!r} does not exist in this project")

    async def _parse(self, project: ProjectRef, raw_target: Any, raw_source: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """The rules that need the project: the target exists, and what an agent or function target needs."""
        target = parse_target(raw_target)
        service, path = target["service"], target["path"]
        kind = await self._target_kind(project, service)
        if kind in ("agent", "function") and path not in AGENT_PATHS:
            article = "an" if kind == "agent" else "a"
            raise BadRequest(f"{article} {kind} serves only /invoke and /invoke/stream; set target.path to /invoke")
        parsed_source = parse_source(raw_source)
        if kind == "agent" and parsed_source["type"] == "schedule":
            require_invoke_body(parsed_source["schedule"]["payload"])
        return target, parsed_source

    # ------------------------------------------------------------------------------------ view

    def _view(self, project: ProjectRef, row: TriggerRow, runs: list[RunRow] | None = None) -> models.Trigger:
        body: dict[str, Any] = {
            "name": row.name,
            "project": f"projects/{project.short}/triggers/{row.name}",
            "target": dict(row.target),
            "source": dict(row.source),
            "state": row.state,
            "ready": row.state == "ready",
            "delivery_url": self.delivery_url(project, row.target),
            "created_at": rfc3339(row.created_at),
            "updated_at": rfc3339(row.updated_at),
        }
        if row.message:
            body["message"] = row.message
        if runs is not None:
            body["runs"] = [_run_view(r) for r in runs]
        return models.Trigger.of(body)

    @staticmethod
    def _row_sync(session: Session, project_id: str, name: str) -> TriggerRow:
        row = session.scalar(select(TriggerRow).where(TriggerRow.project_id == project_id, TriggerRow.name == name))
        if row is None:
            raise NotFound(TRIGGER_NOT_FOUND)
        return row

    @staticmethod
    def _runs_sync(session: Session, trigger_id: str) -> list[RunRow]:
        return list(session.scalars(select(RunRow).where(RunRow.trigger_id == trigger_id)
                                    .order_by(RunRow.started_at.desc(), RunRow.occurrence.desc()).limit(RUNS_SHOWN)))

    # ------------------------------------------------------------------------------------ CRUD

    async def create(self, principal: Principal, project_id: str, body: models.TriggerCreate) -> models.Trigger:
        """202: the trigger in `pending`; it turns `ready` once its source is set up."""
        project = await self._project(principal, project_id)
        name = body.name
        target, source = await self._parse(project, body.target.model_dump(), _source_json(body.source))
        now = self.clock.now()

        def insert(session: Session) -> TriggerRow:
            if session.scalar(select(TriggerRow.id).where(TriggerRow.project_id == project.id,
                                                          TriggerRow.name == name)) is not None:
                raise Conflict(TRIGGER_NAME_TAKEN)
            row = TriggerRow(project_id=project.id, name=name, target=target, source=source, state="pending",
                             message="", schedule_from=now, created_at=now, updated_at=now)
            session.add(row)
            self.audit.record(session, project.id, principal, "serverless.trigger.create", name,
                              {"target": target, "source": source["type"]})
            return row

        try:
            row = await self.db.run(insert)
        except IntegrityError:
            raise Conflict(TRIGGER_NAME_TAKEN) from None
        view = self._view(project, row)
        self._spawn(self._reconcile(project, row.id))
        return view

    async def list(self, principal: Principal, project_id: str, *, page_size: Any = None,
                   page_token: str | None = None) -> models.TriggerList:
        project = await self._project(principal, project_id)
        request = self.pager.request(f"triggers:{project.id}", page_size, page_token)
        rows = await self.db.run(lambda s: list(s.scalars(
            select(TriggerRow).where(TriggerRow.project_id == project.id).order_by(TriggerRow.name)
            .offset(request.offset).limit(request.size + 1))))
        page = self.pager.page_from_probe(rows, request)
        items = [self._view(project, r).to_json() for r in page.items]
        return models.TriggerList.of(
            page_body("triggers", Page(items, page.next_page_token, page.extra), omit_empty_token=True))

    async def get(self, principal: Principal, project_id: str, name: str) -> models.Trigger:
        """The trigger with its runs record (newest first)."""
        project = await self._project(principal, project_id)

        def run(session: Session) -> tuple[TriggerRow, builtins.list[RunRow]]:
            row = self._row_sync(session, project.id, name)
            return row, self._runs_sync(session, row.id)

        row, runs = await self.db.run(run)
        return self._view(project, row, runs)

    async def patch(self, principal: Principal, project_id: str, name: str, body: models.TriggerPatch) -> models.Trigger:
        """Sparse: `target` and `source` replace their block when sent; the trigger is set up again."""
        project = await self._project(principal, project_id)
        if "name" in body.model_fields_set and body.name != name:
            raise BadRequest("name cannot be changed: a trigger cannot be renamed")
        old = await self.db.run(lambda s: self._row_sync(s, project.id, name))
        target, source = await self._parse(
            project, body.target.model_dump() if body.target else old.target,
            _source_json(body.source) if body.source else old.source)
        now = self.clock.now()

        def save(session: Session) -> TriggerRow:
            row = self._row_sync(session, project.id, name)
            row.target, row.source, row.state, row.message, row.updated_at = target, source, "pending", "", now
            if source != old.source:
                row.schedule_from = now
            self.audit.record(session, project.id, principal, "serverless.trigger.update", name)
            return row

        row = await self.db.run(save)
        if old.source.get("type") == "pubsub" and old.source != source:
            await self._drop_subscription(project, old)
        view = self._view(project, row)
        self._spawn(self._reconcile(project, row.id))
        return view

    async def delete(self, principal: Principal, project_id: str, name: str) -> None:
        project = await self._project(principal, project_id)
        row = await self.db.run(lambda s: self._row_sync(s, project.id, name))
        await self._remove(project, row, principal)

    async def _remove(self, project: ProjectRef, row: TriggerRow, principal: Principal | None) -> None:
        """Drop a pubsub trigger's push subscription, then the trigger and its runs. `principal` None:
        the platform acts (a project delete)."""
        if row.source.get("type") == "pubsub":
            await self._drop_subscription(project, row)

        def run(session: Session) -> None:
            session.execute(cast(Table, TriggerRow.__table__).delete().where(TriggerRow.id == row.id))
            self.audit.record(session, project.id, principal, "serverless.trigger.delete", row.name)

        await self.db.run(run)

    async def purge(self, project: ProjectRef) -> int:
        """Every trigger of a project being deleted, and its buckets (`<buckets-root>/<short>`, what
        objectstore triggers poll); returns how many triggers were removed."""
        rows = await self.db.run(lambda s: list(s.scalars(
            select(TriggerRow).where(TriggerRow.project_id == project.id).order_by(TriggerRow.name))))
        removed = await remove_each("trigger", rows, lambda row: row.name,
                                    lambda row: self._remove(project, row, None))
        if self.buckets_root is not None and project.short:  # never the root of every project's buckets
            buckets = self.buckets_root / project.short
            await anyio.to_thread.run_sync(lambda: shutil.rmtree(buckets, ignore_errors=True))
        return removed

    async def _drop_subscription(self, project: ProjectRef, row: TriggerRow) -> None:
        if self.pubsub is None:
            return
        try:
            await self.pubsub.delete_push_subscription(project.id, row.source["pubsub"]["topic"],
                                                       subscription_name(row.name))
        except Exception:  # noqa: BLE001 - the trigger goes anyway; a leftover subscription is logged
            log.warning("serverless: could not delete the push subscription of trigger %s", row.name, exc_info=True)


def _source_json(source: models.TriggerSource) -> dict[str, Any]:
    return source.model_dump(exclude_none=True)


def _run_view(run: RunRow) -> dict[str, Any]:
    return {
        "id": run.id,
        "occurrence": run.occurrence,
        "status": run.status,
        "http_status": run.http_status,
        "error": run.error,
        "started_at": rfc3339(run.started_at),
        "finished_at": rfc3339(run.finished_at) if run.finished_at else None,
    }


