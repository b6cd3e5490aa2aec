"""How triggers fire (document 3): their set-up (a bucket made, a push subscription created), the scheduler
that fires due schedule occurrences and polls buckets, the claim of each run (once among replicas) and its
delivery to the target. A layer of `TriggerService` (`services/serverless_triggers.py`)."""

from __future__ import annotations

import asyncio
import builtins
import functools
import json
import logging
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import anyio.to_thread
import httpx
from croniter import croniter
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.db.models.serverless import ServerlessTrigger as TriggerRow
from caiplatform.db.models.serverless import ServerlessTriggerRun as RunRow
from caiplatform.ports.runtime import WorkloadRef, WorkloadRuntime
from caiplatform.redaction import one_line
from caiplatform.services.access import ProjectRef

if TYPE_CHECKING:
    from caiplatform.services.serverless_triggers import PushSubscriptions, WorkloadFinder

log = logging.getLogger(__name__)

# Occurrences missed while no scheduler ran (every replica down): only the newest fires, as a
# Kubernetes CronJob starts only its most recent missed schedule.
MAX_CATCH_UP = 1
OBJECT_EVENT_TYPE = "ai.platform.objectstore.object.v1.finalized"
# Buckets are listed at most this often (the scheduler ticks every second).
OBJECTSTORE_POLL_SECONDS = 5.0
PUBSUB_UNWIRED = "the messaging service is not available on this platform, so the push subscription cannot be created"


def subscription_name(trigger: str) -> str:
    return f"trigger-{trigger}"


def run_lock(trigger_id: str, occurrence: str) -> str:
    """The work lock of one firing."""
    return f"trigger-run:{trigger_id}:{occurrence}"


def _restart_run(session: Session, trigger_id: str, occurrence: str, now: datetime) -> bool:
    """Mark an orphaned run started again; False when it finished between the read and the lock."""
    run = session.scalar(select(RunRow).where(RunRow.trigger_id == trigger_id, RunRow.occurrence == occurrence))
    if run is None or run.status != "running":
        return False
    run.started_at = now
    return True


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


def next_occurrence(schedule: Mapping[str, Any], after: datetime) -> datetime:
    """When a schedule fires next after `after` (for display and tests)."""
    zone = ZoneInfo(schedule.get("time_zone") or "UTC")
    return croniter(schedule["cron"], after.astimezone(zone)).get_next(datetime)


class TriggerRuns:
    """The firing side of the trigger service: set-up, the scheduler and bucket polling, runs."""

    db: Database
    clock: Clock
    runtime: WorkloadRuntime
    find_workload: WorkloadFinder | None
    pubsub: PushSubscriptions | None
    buckets_root: Path | None
    acquire_timeout: float
    locks: Any
    _polled_at: float | None
    _tasks: set[asyncio.Task[Any]]
    _scheduler: asyncio.Task[None] | None

    @staticmethod
    def delivery_url(project: ProjectRef, target: Mapping[str, Any]) -> str:
        return f"http://{target['service']}.{project.namespace}.svc.cluster.local{target['path']}"

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
        status: int | None = None
        error = ""
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
        await self._finish_run(row, occurrence, status, error)

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
