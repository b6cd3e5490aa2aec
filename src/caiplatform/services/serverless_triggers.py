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
agents area provides.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast
from zoneinfo import ZoneInfo

import anyio.to_thread
import httpx
from croniter import croniter
from sqlalchemy import Table, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform import tracing
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
from caiplatform.redaction import one_line
from caiplatform.services.access import ProjectRef
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each
from caiplatform.worklocks import LocalWorkLocks

log = logging.getLogger(__name__)

AGENT_PATHS = ("/invoke", "/invoke/stream")
RUNS_SHOWN = 50
# Occurrences missed while no scheduler ran (every replica down): only the newest fires, as a
# Kubernetes CronJob starts only its most recent missed schedule.
MAX_CATCH_UP = 1
OBJECT_EVENT_TYPE = "ai.platform.objectstore.object.v1.finalized"
# Buckets are listed at most this often (the scheduler ticks every second).
OBJECTSTORE_POLL_SECONDS = 5.0
PUBSUB_UNWIRED = "the messaging service is not available on this platform, so the push subscription cannot be created"


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


def subscription_name(trigger: str) -> str:
    return f"trigger-{trigger}"


class TriggerService:
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
        self.metrics: Any = None  # the platform's `Metrics` (cai_trigger_firings_total), set by the platform

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

    @staticmethod
    def delivery_url(project: ProjectRef, target: Mapping[str, Any]) -> str:
        return f"http://{target['service']}.{project.namespace}.svc.cluster.local{target['path']}"

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

    # ------------------------------------------------------------------------------------ set-up

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait for set-ups and firings in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _reconcile(self, project: ProjectRef, trigger_id: str) -> None:
        row = await self.db.run(lambda s: s.get(TriggerRow, trigger_id))
        if row is None:
            return
        state, message = "ready", ""
        if row.source["type"] == "objectstore":
            bucket = self.bucket_dir(project.short, row.source["objectstore"]["bucket"])
            if bucket is None:
                state, message = "pending", "this platform has no object storage (no buckets root is configured)"
            else:
                await anyio.to_thread.run_sync(lambda: bucket.mkdir(parents=True, exist_ok=True))
        elif row.source["type"] == "pubsub":
            if self.pubsub is None:
                state, message = "pending", PUBSUB_UNWIRED
            else:
                try:
                    await self.pubsub.ensure_push_subscription(
                        project.id, row.source["pubsub"]["topic"], subscription_name(row.name),
                        self.delivery_url(project, row.target), "cloudevents-binary")
                except Exception as exc:  # noqa: BLE001 - reported on the trigger, retried by a PATCH
                    state, message = "pending", f"the push subscription could not be created: {exc}"

        ready_at = self.clock.now()

        def save(session: Session) -> None:
            current = session.get(TriggerRow, trigger_id)
            if current is not None and current.updated_at == row.updated_at:
                current.state, current.message = state, message
                if current.source.get("type") == "objectstore" and state == "ready":
                    current.schedule_from = ready_at  # objects modified from now on fire

        await self.db.run(save)

    # ------------------------------------------------------------------------------------ scheduler

    def start(self, interval: float = 1.0) -> None:
        if self._scheduler is None:
            self._scheduler = asyncio.get_running_loop().create_task(self._loop(interval))

    async def close(self) -> None:
        if self._scheduler is not None:
            self._scheduler.cancel()
            try:
                await self._scheduler
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
                pass
            self._scheduler = None
        await self.wait_idle()

    async def _loop(self, interval: float) -> None:
        while True:
            try:
                await self.run_due()
            except Exception:  # noqa: BLE001 - the scheduler outlives one bad tick
                log.exception("serverless: scheduler tick failed")
            await asyncio.sleep(interval)

    async def run_due(self, *, force_poll: bool = False) -> int:
        """Fire every schedule occurrence that is due by the clock now and every new or changed object of
        the polled buckets (at most every few seconds, or now with `force_poll`); returns how many fired.

        Each firing is claimed by its run row first, so a replica that lost the race skips it."""
        now = self.clock.now()
        rows = await self.db.run(lambda s: list(s.scalars(
            select(TriggerRow).where(TriggerRow.state == "ready"))))
        claimed: builtins.list[tuple[TriggerRow, str]] = []
        for row in rows:
            if row.source.get("type") != "schedule":
                continue
            for occurrence in _due(row.source["schedule"], row.schedule_from or row.created_at, now):
                if await self._claim(row, occurrence):
                    claimed.append((row, rfc3339(occurrence)))
        fired: builtins.list[Awaitable[None]] = [self._fire_schedule(row, occ) for row, occ in claimed]
        if self.locks.shared:
            fired.extend(await self._take_over_orphans({row.id: row for row in rows}))
        monotonic = self.clock.monotonic()
        if force_poll or self._polled_at is None or monotonic - self._polled_at >= OBJECTSTORE_POLL_SECONDS:
            self._polled_at = monotonic
            try:
                await self._retry_pending()
            except Exception:  # noqa: BLE001 - retried at the next poll
                log.exception("serverless: setting up pending pubsub triggers failed")
            for row in rows:
                if row.source.get("type") == "objectstore":
                    try:
                        fired.extend(await self._poll_bucket(row))
                    except Exception:  # noqa: BLE001 - one unreadable bucket must not stop the others
                        log.exception("serverless: polling the bucket of trigger %s failed", row.name)
        await asyncio.gather(*fired)
        return len(fired)

    async def record_push(self, ref: WorkloadRef, headers: httpx.Headers, status: int | None, error: str) -> None:
        """A push delivery of a pubsub trigger's subscription (`ce-subscription: trigger-<name>`) becomes a
        run of that trigger (occurrence `<ce-id>#<attempt>`)."""
        subscription = headers.get("ce-subscription", "")
        if not subscription.startswith("trigger-"):
            return
        name = subscription.removeprefix("trigger-")
        occurrence = f"{headers.get('ce-id', '')}#{headers.get('ce-deliveryattempt', '1')}"[:200]
        now = self.clock.now()

        def run(session: Session) -> None:
            row = session.scalar(select(TriggerRow).where(TriggerRow.project_id == ref.project_id,
                                                          TriggerRow.name == name))
            if row is None or row.source.get("type") != "pubsub" or row.target.get("service") != ref.name:
                return
            session.add(RunRow(trigger_id=row.id, occurrence=occurrence, status="failed" if error else "succeeded",
                               http_status=status, error=error, started_at=now, finished_at=now))

        try:
            await self.db.run(run)
        except IntegrityError:
            pass  # the same attempt recorded twice

    async def _retry_pending(self) -> None:
        """A pubsub trigger stays pending until its topic and subscription are ready: try again. A ready
        one is checked too (setting up is idempotent): when its topic was deleted it goes back to pending,
        saying why, and a topic made again gets its subscription again."""
        if self.pubsub is None:
            return
        from caiplatform.db.models import Project

        def pending(session: Session) -> builtins.list[tuple[ProjectRef, str]]:
            out = []
            for row in session.scalars(select(TriggerRow).where(TriggerRow.state.in_(("pending", "ready")))):
                project = session.get(Project, row.project_id)
                if row.source.get("type") == "pubsub" and project is not None:
                    out.append((ProjectRef.of(project), row.id))
            return out

        for project, trigger_id in await self.db.run(pending):
            await self._reconcile(project, trigger_id)

    def bucket_dir(self, project_short: str, bucket: str) -> Path | None:
        return self.buckets_root / project_short / bucket if self.buckets_root is not None else None

    async def _poll_bucket(self, row: TriggerRow) -> builtins.list[Awaitable[None]]:
        """Claims for the bucket's objects modified since the trigger became ready (new or changed)."""
        from caiplatform.db.models import Project

        project = await self.db.run(lambda s: s.get(Project, row.project_id))
        source = row.source["objectstore"]
        bucket = self.bucket_dir(project.short, source["bucket"]) if project is not None else None
        if bucket is None or row.schedule_from is None:
            return []
        since = row.schedule_from.timestamp()
        objects = await anyio.to_thread.run_sync(_list_objects, bucket, source.get("prefix", ""))
        candidates = {f"{name}@{mtime_ns}:{size}"[:200]: (name, mtime_ns, size)
                      for name, mtime_ns, size in objects if mtime_ns / 1e9 > since}
        if not candidates:
            return []
        fired_before = set(await self.db.run(lambda s: s.scalars(select(RunRow.occurrence).where(
            RunRow.trigger_id == row.id, RunRow.occurrence.in_(list(candidates)))).all()))
        out: builtins.list[Awaitable[None]] = []
        for occurrence, (name, mtime_ns, size) in candidates.items():
            if occurrence in fired_before:
                continue
            if await self._claim(row, occurrence, move_schedule=False):
                out.append(self._fire_object(row, occurrence, source["bucket"], name, mtime_ns, size))
        return out

    async def _fire_object(self, row: TriggerRow, occurrence: str, bucket: str, name: str, mtime_ns: int,
                           size: int) -> None:
        """A CloudEvent in binary mode: the object's metadata as the JSON body, the envelope in headers."""
        updated = rfc3339(datetime.fromtimestamp(mtime_ns / 1e9, tz=UTC))
        body = json.dumps({"bucket": bucket, "name": name, "size": size, "updated": updated}).encode()
        headers = {
            "content-type": "application/json", "ce-specversion": "1.0", "ce-type": OBJECT_EVENT_TYPE,
            "ce-id": occurrence, "ce-source": f"buckets/{bucket}", "ce-subject": f"objects/{name}",
            "ce-time": updated, "x-cai-trigger": row.name,
        }
        await self._deliver(row, occurrence, body, headers)

    async def _take_over_orphans(self, ready: Mapping[str, TriggerRow]) -> builtins.list[Awaitable[None]]:
        """Fire again the runs a replica claimed and died before finishing: `running`, lock free."""
        orphans = await self.db.run(lambda s: [(r.trigger_id, r.occurrence) for r in s.scalars(
            select(RunRow).where(RunRow.status == "running", RunRow.trigger_id.in_(list(ready))))])
        out: list[Awaitable[None]] = []
        for trigger_id, occurrence in orphans:
            lock = run_lock(trigger_id, occurrence)
            if not await self.locks.try_acquire(lock):
                continue  # its claimer is alive and still firing it
            restart = functools.partial(_restart_run, trigger_id=trigger_id, occurrence=occurrence, now=self.clock.now())
            if not await self.db.run(restart):
                await self.locks.release(lock)
                continue
            row = ready[trigger_id]
            log.warning("serverless: trigger %s occurrence %s was claimed by a replica that stopped; "
                        "firing it here", row.name, occurrence)
            if row.source.get("type") == "schedule":
                out.append(self._fire_schedule(row, occurrence))
            else:
                out.append(self._refire_object(row, occurrence))
        return out

    async def _refire_object(self, row: TriggerRow, occurrence: str) -> None:
        name, _, version = occurrence.rpartition("@")
        mtime_ns, _, size = version.partition(":")
        if not (name and mtime_ns.isdigit() and size.isdigit()):  # a name too long kept in full
            await self._finish_run(row, occurrence, None, "the replica that claimed this object stopped")
            return
        await self._fire_object(row, occurrence, row.source["objectstore"]["bucket"], name, int(mtime_ns), int(size))

    async def _claim(self, row: TriggerRow, occurrence: datetime | str, *, move_schedule: bool = True) -> bool:
        """Take the occurrence's work lock, then insert its run row (the unique row decides the race)."""
        now = self.clock.now()
        key = occurrence if isinstance(occurrence, str) else rfc3339(occurrence)
        lock = run_lock(row.id, key)
        if not await self.locks.try_acquire(lock):
            return False

        def run(session: Session) -> None:
            session.add(RunRow(trigger_id=row.id, occurrence=key, status="running", error="", started_at=now))
            current = session.get(TriggerRow, row.id)
            if move_schedule and isinstance(occurrence, datetime) and current is not None and (
                    current.schedule_from is None or current.schedule_from < occurrence):
                current.schedule_from = occurrence

        try:
            await self.db.run(run)
        except IntegrityError:
            await self.locks.release(lock)
            return False
        except BaseException:
            await self.locks.release(lock)
            raise
        return True

    async def _fire_schedule(self, row: TriggerRow, occurrence: str) -> None:
        payload = row.source["schedule"].get("payload", "")
        headers = {"content-type": "application/json", "x-cai-trigger": row.name, "x-cai-occurrence": occurrence}
        await self._deliver(row, occurrence, payload.encode(), headers)

    async def _deliver(self, row: TriggerRow, occurrence: str, content: bytes, headers: dict[str, str]) -> None:
        if tracing.tracer() is None:
            await self._deliver_once(row, occurrence, content, headers)
            return
        # A trace of its own per firing; the target gets its traceparent.
        with tracing.span(f"trigger {row.name}", {"caiplatform.trigger": row.name,
                                                  "caiplatform.trigger.kind": str(row.source.get("type", "")),
                                                  "caiplatform.trigger.occurrence": occurrence},
                          kind="PRODUCER", root=True):
            tracing.inject(headers)
            await self._deliver_once(row, occurrence, content, headers)

    async def _deliver_once(self, row: TriggerRow, occurrence: str, content: bytes, headers: dict[str, str]) -> None:
        status: int | None = None
        error = ""
        ref: WorkloadRef | None = None
        try:
            ref = await self._target_ref(row)
            endpoint = await self.runtime.acquire(ref, timeout=self.acquire_timeout)
            try:
                async with endpoint.client(timeout=self.acquire_timeout) as client:
                    response = await client.post(row.target["path"], content=content, headers=headers)
                status = response.status_code
                if not 200 <= status < 300:
                    error = f"the target answered {status}: {response.text[:200]}"
            finally:
                await endpoint.release()
        except Exception as exc:  # noqa: BLE001 - recorded in the runs record, one line without server paths
            log.warning("trigger %s: delivery failed: %s", row.name, exc)
            error = one_line(str(exc)) or type(exc).__name__
        if self.metrics is not None:
            short = ref.project_short if ref is not None else await self._project_short(row.project_id)
            self.metrics.observe_trigger(short, str(row.source.get("type", "")), not error)
        await self._finish_run(row, occurrence, status, error)

    async def _project_short(self, project_id: str) -> str:
        """A project's short id (the metrics' label) when no target resolved it."""
        from caiplatform.db.models import Project

        def read(session: Session) -> str:
            project = session.get(Project, project_id)
            return project.short if project is not None else ""

        try:
            return await self.db.run(read)
        except Exception:  # noqa: BLE001 - a label is not worth a failed run record
            return ""

    async def _finish_run(self, row: TriggerRow, occurrence: str, status: int | None, error: str) -> None:
        """Record the run's end, then let go of its work lock (in that order: a free lock on a `running`
        run means its claimer is gone)."""
        finished = self.clock.now()

        def save(session: Session) -> None:
            run = session.scalar(select(RunRow).where(RunRow.trigger_id == row.id, RunRow.occurrence == occurrence))
            if run is not None:
                run.status = "failed" if error else "succeeded"
                run.http_status, run.error, run.finished_at = status, error, finished

        try:
            await self.db.run(save)
        finally:
            await self.locks.release(run_lock(row.id, occurrence))

    async def _target_ref(self, row: TriggerRow) -> WorkloadRef:
        service = row.target["service"]

        def run(session: Session) -> WorkloadRef | None:
            from caiplatform.db.models import Project

            project = session.get(Project, row.project_id)
            exists = session.scalar(select(ServiceRow.id).where(ServiceRow.project_id == row.project_id,
                                                                 ServiceRow.name == service))
            if project is None or exists is None:
                return None
            return WorkloadRef(project.id, project.short, service, kind="service")

        ref = await self.db.run(run)
        if ref is not None:
            return ref
        if self.find_workload is not None:
            found = await self.find_workload(row.project_id, service)
            if found is not None:
                return found[0]
        raise LookupError(f"target {service!r} no longer exists in this project")


def _restart_run(session: Session, trigger_id: str, occurrence: str, now: datetime) -> bool:
    """Mark an orphaned run started again; False when it finished between the read and the lock."""
    run = session.scalar(select(RunRow).where(RunRow.trigger_id == trigger_id, RunRow.occurrence == occurrence))
    if run is None or run.status != "running":
        return False
    run.started_at = now
    return True


def run_lock(trigger_id: str, occurrence: str) -> str:
    """The work lock of one firing."""
    return f"trigger-run:{trigger_id}:{occurrence}"


def _source_json(source: models.TriggerSource) -> dict[str, Any]:
    return source.model_dump(exclude_none=True)


def _list_objects(bucket: Path, prefix: str) -> list[tuple[str, int, int]]:
    """(object name, mtime in ns, size) of every regular file below the bucket whose name starts with
    `prefix`; hidden files (names starting with a dot, e.g. partial uploads) are left out."""
    out: list[tuple[str, int, int]] = []
    if not bucket.is_dir():
        return out
    for path in bucket.rglob("*"):
        name = path.relative_to(bucket).as_posix()
        if any(part.startswith(".") for part in name.split("/")) or not name.startswith(prefix):
            continue
        try:
            stat = path.stat()
        except OSError:
            continue
        if path.is_file():
            out.append((name, stat.st_mtime_ns, stat.st_size))
    return sorted(out)


def _due(schedule: Mapping[str, Any], since: datetime, now: datetime) -> list[datetime]:
    """Occurrences strictly after `since` up to `now`, in the schedule's time zone (the newest few)."""
    zone = ZoneInfo(schedule.get("time_zone") or "UTC")
    it = croniter(schedule["cron"], since.astimezone(zone))
    out: list[datetime] = []
    while True:
        moment = it.get_next(datetime)
        if moment > now.astimezone(zone):
            break
        out.append(moment)
        if len(out) > 10_000:  # a cron of every minute over a week is 10080; never loop unbounded
            break
    return out[-MAX_CATCH_UP:]


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


def next_occurrence(schedule: Mapping[str, Any], after: datetime) -> datetime:
    """When a schedule fires next after `after` (for display and tests)."""
    zone = ZoneInfo(schedule.get("time_zone") or "UTC")
    return croniter(schedule["cron"], after.astimezone(zone)).get_next(datetime)


