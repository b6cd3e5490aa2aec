"""What both workload runtimes share: revisions, the traffic split, instance slots and scale to zero.

`InstanceRuntime` implements the whole `WorkloadRuntime` port over three adapter hooks — start one
instance of a revision, stop it, say whether it still lives — plus log hooks. The in-memory runtime
starts an in-process ASGI app, the local runtime a supervised subprocess; routing, scaling and the
views (status, spec document, metrics, usage) are the same code, so both behave alike.

Scheduling, in Knative's terms:
- A request picks a revision by the split with smooth weighted round robin (exact shares over any
  window of 100 requests, no randomness in tests), or by tag.
- An instance serves at most `container_concurrency` requests at once (0: unbounded); a revision
  holds at most `max_scale` instances (0: `DEFAULT_MAX_SCALE`). A request that finds no free slot and
  no room to start an instance waits until `timeout`, then `NoCapacity`.
- A new revision starts one instance at once to prove it healthy (`ready`), which then idles out like
  any other. An instance idle for `idle_seconds` stops unless `min_scale` keeps it; `min_scale` applies
  to revisions that traffic can reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from caiplatform.domain.spec_document import knative_service, knative_template_spec
from caiplatform.metrics import Metrics
from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import (
    DEFAULT_CONTAINER_CONCURRENCY,
    DEFAULT_MAX_SCALE,
    Endpoint,
    InstanceTransport,
    NoCapacity,
    ResolvedTraffic,
    RevisionSpec,
    RevisionState,
    RevisionStatus,
    TrafficTarget,
    WorkloadError,
    WorkloadMetrics,
    WorkloadRef,
    WorkloadRuntime,
    WorkloadStatus,
)
from caiplatform.redaction import one_line

log = logging.getLogger(__name__)

ImageResolver = Callable[[str], Awaitable[Image | None]]

HEALTH_PATH = "/healthz"
#: How long a new revision's first instance may take to answer its health check.
READINESS_TIMEOUT_SECONDS = 120.0
DEFAULT_IDLE_SECONDS = 90.0
DEFAULT_LOG_RETENTION = timedelta(days=14)

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, default: timedelta = DEFAULT_LOG_RETENTION) -> timedelta:
    """A Go-style duration (`336h`, `14d`, `1h30m`, `90s`); a bare number is hours. Garbage: `default`."""
    text = (text or "").strip().lower()
    if not text:
        return default
    try:
        return timedelta(hours=float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return default
    return timedelta(seconds=sum(float(n) * _DURATION_UNITS[u] for n, u in parts))


class InstanceStartError(Exception):
    """An instance did not start or did not become healthy; `reason` is a CamelCase word for the revision."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        self.message = message
        super().__init__(f"{reason}: {message}")


def instance_env(image: Image | None, spec: RevisionSpec, port: int) -> dict[str, str]:
    """Image variables, then the revision's plain and secret variables, then what the runtime sets."""
    env: dict[str, str] = {}
    if image is not None:
        env.update(image.env)
    env.update(spec.env)
    env.update(spec.secret_env)
    env.update({
        "PORT": str(port),
        "K_REVISION": spec.revision,
        "K_SERVICE": spec.workload.name,
        "K_CONFIGURATION": spec.workload.name,
    })
    return env


def internal_url(ref: WorkloadRef, tag: str | None = None) -> str:
    host = f"{tag}-{ref.name}" if tag else ref.name
    return f"http://{host}.{ref.namespace}.svc.cluster.local"


@dataclass(eq=False)
class Instance:
    name: str  # the pod name: <revision>-<5 random>
    revision: str
    base_url: str
    started_at: datetime
    transport: Any = None  # httpx transport of an in-process instance
    handle: Any = None  # adapter-specific (the managed process, the app and its lifespan)
    in_flight: int = 0
    served: int = 0
    last_used: float = field(default_factory=time.monotonic)
    stopping: bool = False


@dataclass(eq=False)
class Revision:
    spec: RevisionSpec
    created_at: datetime
    state: RevisionState = "unknown"
    reason: str = ""
    message: str = ""
    instances: list[Instance] = field(default_factory=list)
    starting: int = 0
    waiting: int = 0  # requests queued for a slot of this revision

    @property
    def name(self) -> str:
        return self.spec.revision

    @property
    def ceiling(self) -> int:
        return self.spec.scaling.max_scale or DEFAULT_MAX_SCALE

    @property
    def concurrency(self) -> int:
        return self.spec.scaling.container_concurrency  # 0: unbounded

    def should_scale_up(self) -> bool:
        """Start another instance for a request that found no free slot? Only below the ceiling, and only
        when the instances already starting will not hold every queued request (so a burst on a cold
        revision starts one instance per `container_concurrency` requests, not one per request)."""
        if len(self.instances) + self.starting >= self.ceiling:
            return False
        if self.starting == 0:
            return True
        if self.concurrency == 0:
            return False  # one unbounded instance on its way takes them all
        return self.starting * self.concurrency < self.waiting + 1

    def free_instance(self) -> Instance | None:
        live = [i for i in self.instances if not i.stopping]
        limit = self.concurrency
        candidates = [i for i in live if limit == 0 or i.in_flight < limit]
        # The least busy first, then the most recently used (keeps others idle so they can stop).
        return min(candidates, key=lambda i: (i.in_flight, -i.last_used), default=None)


@dataclass(eq=False)
class Workload:
    ref: WorkloadRef
    revisions: dict[str, Revision] = field(default_factory=dict)  # creation order
    traffic: list[TrafficTarget] = field(default_factory=lambda: [TrafficTarget(100, latest_revision=True)])
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    # Smooth weighted round robin state, one counter per traffic entry.
    _current: list[int] = field(default_factory=list)

    def newest(self) -> Revision | None:
        return max(self.revisions.values(), key=lambda r: r.spec.generation, default=None)

    def latest_ready(self) -> Revision | None:
        ready = [r for r in self.revisions.values() if r.state == "ready"]
        return max(ready, key=lambda r: r.spec.generation, default=None)

    def resolve(self, target: TrafficTarget) -> Revision | None:
        if target.latest_revision:
            return self.latest_ready()
        return self.revisions.get(target.revision_name or "")

    def routed(self) -> set[str]:
        """Revisions that traffic can reach now (a share above zero, or a tag)."""
        out = set()
        for target in self.traffic:
            revision = self.resolve(target)
            if revision is not None and (target.percent > 0 or target.tag):
                out.add(revision.name)
        return out

    def pick(self, tag: str | None) -> tuple[Revision | None, TrafficTarget | None]:
        if tag is not None:
            for target in self.traffic:
                if target.tag == tag:
                    return self.resolve(target), target
            raise LookupError(f"no traffic target is tagged {tag!r}")
        if len(self._current) != len(self.traffic):
            self._current = [0] * len(self.traffic)
        total = sum(t.percent for t in self.traffic)
        if total <= 0:
            return None, None
        for i, target in enumerate(self.traffic):
            self._current[i] += target.percent
        best = max(range(len(self.traffic)), key=lambda i: self._current[i])
        self._current[best] -= total
        target = self.traffic[best]
        return self.resolve(target), target


class InstanceRuntime(WorkloadRuntime):
    """The port over `_start_instance` / `_stop_instance` / `_instance_alive` and the log hooks."""

    def __init__(
        self,
        *,
        images: ImageResolver | None = None,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        log_retention: timedelta | str = DEFAULT_LOG_RETENTION,
        readiness_timeout: float = READINESS_TIMEOUT_SECONDS,
    ):
        self.images = images
        self.idle_seconds = float(idle_seconds)
        self.log_retention = parse_duration(log_retention) if isinstance(log_retention, str) else log_retention
        self.readiness_timeout = readiness_timeout
        self._workloads: dict[str, Workload] = {}
        self._changed: asyncio.Condition | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._housekeeper: asyncio.Task[None] | None = None
        self._closed = False

    # -- adapter hooks ------------------------------------------------------------------------------

    @abstractmethod
    async def _start_instance(self, workload: Workload, revision: Revision, image: Image | None, timeout: float) -> Instance:
        """Start one instance and return it once healthy; raise `InstanceStartError` otherwise."""

    @abstractmethod
    async def _stop_instance(self, workload: Workload, instance: Instance) -> None:
        """Stop it (its log lines are kept in the history)."""

    def _instance_alive(self, instance: Instance) -> bool:
        return True

    def _exit_reason(self, workload: Workload, revision: Revision, instance: Instance) -> tuple[str, str] | None:
        """Why an instance that died on its own died, when the runtime knows (`OOMKilled`)."""
        return None

    def _persist(self, workload: Workload) -> None:  # noqa: B027 - optional hook
        """Record the workload's revisions and traffic (durable runtimes)."""

    def _forget(self, ref: WorkloadRef) -> None:  # noqa: B027 - optional hook
        """Drop what `_persist` and the log history recorded."""

    async def _housekeep_logs(self) -> None:  # noqa: B027 - optional hook
        """Periodic log work (ingesting instance output, retention)."""

    # -- plumbing -----------------------------------------------------------------------------------

    @property
    def changed(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _ensure_housekeeper(self) -> None:
        if self._housekeeper is None or self._housekeeper.done():
            self._closed = False
            self._housekeeper = asyncio.create_task(self._housekeeping(), name=f"{self.name}-runtime-housekeeping")

    @property
    def tick(self) -> float:
        return max(0.05, min(1.0, self.idle_seconds / 4))

    async def _resolve_image(self, reference: str) -> Image | None:
        if self.images is None:
            return None
        return await self.images(reference)

    @staticmethod
    def _pod_name(revision: Revision) -> str:
        suffix = "".join(secrets.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        return f"{revision.name}-deployment-{suffix}"

    def _workload(self, ref: WorkloadRef) -> Workload | None:
        return self._workloads.get(ref.key)

    def _newest_live(self, ref: WorkloadRef) -> Instance | None:
        """The instance whose lines `logs` shows: the most recently started one still running."""
        workload = self._workload(ref)
        if workload is None:
            return None
        live = [i for r in workload.revisions.values() for i in r.instances if not i.stopping]
        return max(live, key=lambda i: i.started_at, default=None)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self._ensure_housekeeper()

    async def close(self) -> None:
        self._closed = True
        if self._housekeeper is not None:
            self._housekeeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._housekeeper
            self._housekeeper = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(
            self._stop(workload, revision, instance)
            for workload in list(self._workloads.values())
            for revision in workload.revisions.values()
            for instance in list(revision.instances)
        ))  # in parallel: each may take its stop grace
        await self._housekeep_logs()

    # -- the port: writes ---------------------------------------------------------------------------

    async def apply(self, spec: RevisionSpec, traffic: list[TrafficTarget] | None = None) -> None:
        self._ensure_housekeeper()
        workload = self._workloads.get(spec.workload.key)
        if workload is None:
            workload = self._workloads[spec.workload.key] = Workload(spec.workload)
        existing = workload.revisions.get(spec.revision)
        if existing is not None:
            if existing.spec == spec:
                return  # revisions are immutable: applying the same one again changes nothing
            raise WorkloadError(f"revision {spec.revision} already exists and revisions are immutable")
        if traffic is not None:
            self._check_traffic(workload, traffic, extra=spec.revision)
        revision = Revision(spec=spec, created_at=datetime.now(UTC))
        workload.revisions[spec.revision] = revision
        workload.traffic = list(traffic) if traffic else [TrafficTarget(100, latest_revision=True)]
        workload._current = []
        self._persist(workload)
        self._spawn(self._prove_ready(workload, revision), f"ready-{spec.revision}")
        await self._notify()

    async def set_traffic(self, ref: WorkloadRef, traffic: list[TrafficTarget]) -> None:
        workload = self._workload(ref)
        if workload is None:
            raise LookupError(f"no workload named {ref.name}")
        self._check_traffic(workload, traffic)
        workload.traffic = list(traffic)
        workload._current = []
        self._persist(workload)
        await self._notify()

    @staticmethod
    def _check_traffic(workload: Workload, traffic: list[TrafficTarget], extra: str | None = None) -> None:
        for target in traffic:
            name = target.revision_name
            if not target.latest_revision and name not in workload.revisions and name != extra:
                raise WorkloadError(f"revision {name} does not exist for this workload")
        if traffic and sum(t.percent for t in traffic) != 100:
            raise WorkloadError("traffic percentages must sum to 100")

    async def delete(self, ref: WorkloadRef) -> None:
        workload = self._workloads.pop(ref.key, None)
        if workload is not None:
            await asyncio.gather(*(
                self._stop(workload, revision, instance)
                for revision in workload.revisions.values()
                for instance in list(revision.instances)
            ))
        self._forget(ref)
        await self._notify()

    # -- readiness and instances --------------------------------------------------------------------

    async def _prove_ready(self, workload: Workload, revision: Revision) -> None:
        """A new revision's first instance: ready once healthy, else not ready with the reason."""
        revision.starting += 1
        try:
            instance = await self._start(workload, revision, self.readiness_timeout)
        except InstanceStartError:
            return
        finally:
            revision.starting -= 1
            await self._notify()
        instance.last_used = time.monotonic()

    #: The platform's Prometheus metrics (`observe_with`); not `metrics`, the port's per-workload view.
    observed: Metrics | None = None

    def observe_with(self, metrics: Metrics) -> None:
        """Count starts into `metrics` and let it read `cai_agent_instances` from here at scrape time."""
        self.observed = metrics
        metrics.instances_from(self._instance_counts)

    def _instance_counts(self) -> list[tuple[str, str, int]]:
        """(project, workload, live instances) for every workload with one: a walk of dicts in memory."""
        rows = []
        for workload in list(self._workloads.values()):
            count = sum(len(r.instances) for r in list(workload.revisions.values()))
            if count:
                rows.append((workload.ref.project_short, workload.ref.name, count))
        return rows

    async def _start(self, workload: Workload, revision: Revision, timeout: float) -> Instance:
        """Start an instance (the caller counted it in `revision.starting`); update readiness either way."""
        began = time.monotonic()
        try:
            image = await self._resolve_image(revision.spec.image)
            instance = await self._start_instance(workload, revision, image, timeout)
            if self.observed is not None:
                self.observed.observe_start(workload.ref.project_short, workload.ref.name, time.monotonic() - began)
        except Exception as exc:  # noqa: BLE001 - any failure to start is the revision's reason
            failure = exc if isinstance(exc, InstanceStartError) else InstanceStartError(
                "ContainerFailed", f"{type(exc).__name__}: {exc}")
            log.warning("revision %s did not start: %s", revision.name, failure)
            if revision.state != "ready" or not revision.instances:
                # the view's message is one line without server paths; the instance's logs have the rest
                revision.state, revision.reason, revision.message = "not_ready", failure.reason, one_line(failure.message)
                self._persist(workload)
            raise failure from None
        if workload.ref.key not in self._workloads or revision.name not in workload.revisions or self._closed:
            await self._stop_instance(workload, instance)  # deleted while it started
            raise InstanceStartError("Deleted", f"{workload.ref.name} was deleted")
        revision.instances.append(instance)
        if revision.state != "ready":
            revision.state, revision.reason, revision.message = "ready", "", ""
            self._persist(workload)
        return instance

    async def _stop(self, workload: Workload, revision: Revision, instance: Instance) -> None:
        if instance.stopping:
            return
        instance.stopping = True
        try:
            await self._stop_instance(workload, instance)
        except Exception:  # noqa: BLE001 - one failing stop must not keep the others running
            log.exception("stopping instance %s failed", instance.name)
        with contextlib.suppress(ValueError):
            revision.instances.remove(instance)

    async def acquire(self, ref: WorkloadRef, *, timeout: float, tag: str | None = None) -> Endpoint:
        self._ensure_housekeeper()
        workload = self._workload(ref)
        if workload is None or not workload.revisions:
            raise LookupError(f"no revision of {ref.name} exists")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        revision: Revision | None = None
        async with self.changed:
            while True:
                if revision is None or revision.name not in workload.revisions:
                    revision, _ = workload.pick(tag)
                    if revision is None:
                        self._raise_if_hopeless(workload)
                if revision is not None:
                    instance = revision.free_instance()
                    if instance is not None:
                        return self._lease(workload, revision, instance)
                    if revision.should_scale_up():
                        break  # a cold start: done outside the lock
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise self._no_capacity(workload, revision, timeout)
                waiting_on = revision
                if waiting_on is not None:
                    waiting_on.waiting += 1
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.changed.wait(), remaining)
                finally:
                    if waiting_on is not None:
                        waiting_on.waiting -= 1
            revision.starting += 1
        try:
            instance = await self._start(workload, revision, max(0.1, deadline - loop.time()))
        except InstanceStartError as exc:
            raise NoCapacity(f"{ref.name}: revision {revision.name} could not start an instance: {one_line(exc.message)}") from None
        finally:
            revision.starting -= 1
            await self._notify()
        return self._lease(workload, revision, instance)

    def _raise_if_hopeless(self, workload: Workload) -> None:
        """No revision is routable: wait while one is still starting, fail at once when all failed."""
        if any(r.state == "unknown" or r.starting for r in workload.revisions.values()):
            return
        newest = workload.newest()
        detail = f": {newest.message}" if newest is not None and newest.message else ""
        raise NoCapacity(f"{workload.ref.name} has no ready revision to route to{detail}")

    @staticmethod
    def _no_capacity(workload: Workload, revision: Revision | None, timeout: float) -> NoCapacity:
        if revision is None:
            return NoCapacity(f"{workload.ref.name} has no ready revision yet (waited {timeout:g} s)")
        return NoCapacity(
            f"{workload.ref.name}: no instance of revision {revision.name} could take the request within "
            f"{timeout:g} s (max_scale {revision.ceiling}, container_concurrency {revision.concurrency or 'unbounded'})"
        )

    def _lease(self, workload: Workload, revision: Revision, instance: Instance) -> Endpoint:
        instance.in_flight += 1
        instance.served += 1
        instance.last_used = time.monotonic()
        released = False

        async def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            instance.in_flight -= 1
            instance.last_used = time.monotonic()
            await self._notify()

        transport = instance.transport
        if isinstance(transport, InstanceTransport):
            return Endpoint(revision=revision.name, base_url=instance.base_url, release=release, transport=transport,
                            socket=transport.uds, credential=transport.credential)
        return Endpoint(revision=revision.name, base_url=instance.base_url, release=release, transport=transport)

    # -- scale to zero ------------------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        while not self._closed:
            try:
                await self._housekeep_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop must outlive one bad pass
                log.exception("runtime housekeeping failed")
            await asyncio.sleep(self.tick)

    async def _housekeep_once(self) -> None:
        now = time.monotonic()
        changed = False
        for workload in list(self._workloads.values()):
            routed = workload.routed()
            for revision in list(workload.revisions.values()):
                for instance in list(revision.instances):
                    if not instance.stopping and not self._instance_alive(instance):
                        log.warning("instance %s of %s exited", instance.name, revision.name)
                        why = self._exit_reason(workload, revision, instance)
                        if why is not None:
                            # Kept on the (still routable) revision like a pod's last termination reason,
                            # until the next deploy.
                            revision.reason, revision.message = why
                            self._persist(workload)
                        await self._stop(workload, revision, instance)
                        changed = True
                floor = revision.spec.scaling.min_scale if revision.name in routed else 0
                idle = sorted(
                    (i for i in revision.instances if i.in_flight == 0 and not i.stopping),
                    key=lambda i: i.last_used,
                )
                surplus = len(revision.instances) - floor
                for instance in idle:
                    if surplus <= 0:
                        break
                    if now - instance.last_used >= self.idle_seconds:
                        await self._stop(workload, revision, instance)
                        surplus -= 1
                        changed = True
                missing = floor - len(revision.instances) - revision.starting
                if missing > 0 and revision.state == "ready":
                    for _ in range(missing):
                        revision.starting += 1
                        self._spawn(self._warm(workload, revision), f"warm-{revision.name}")
        await self._housekeep_logs()
        if changed:
            await self._notify()

    async def _warm(self, workload: Workload, revision: Revision) -> None:
        try:
            await self._start(workload, revision, self.readiness_timeout)
        except InstanceStartError:
            pass
        finally:
            revision.starting -= 1
            await self._notify()

    # -- the port: reads ----------------------------------------------------------------------------

    def _revision_status(self, workload: Workload, revision: Revision) -> RevisionStatus:
        percent = 0
        tag = None
        for target in workload.traffic:
            if workload.resolve(target) is revision:
                percent += target.percent
                tag = tag or target.tag
        return RevisionStatus(
            name=revision.name,
            generation=revision.spec.generation,
            image=revision.spec.image,
            created_at=revision.created_at,
            state=revision.state,
            reason=revision.reason,
            message=revision.message,
            replicas=sum(1 for i in revision.instances if not i.stopping),
            traffic_percent=percent,
            tag=tag,
            url=internal_url(workload.ref, tag) if tag else "",
        )

    async def status(self, ref: WorkloadRef) -> WorkloadStatus | None:
        workload = self._workload(ref)
        if workload is None:
            return None
        revisions = sorted(workload.revisions.values(), key=lambda r: r.spec.generation, reverse=True)
        traffic = []
        for target in workload.traffic:
            resolved = workload.resolve(target)
            traffic.append(ResolvedTraffic(
                percent=target.percent,
                revision_name=resolved.name if resolved is not None else target.revision_name,
                latest_revision=target.latest_revision,
                tag=target.tag,
                url=internal_url(ref, target.tag) if target.tag else "",
            ))
        newest = workload.newest()
        latest_ready = workload.latest_ready()
        routable = all(
            (r := workload.resolve(t)) is not None and r.state == "ready" for t in workload.traffic if t.percent > 0
        )
        ready = newest is not None and newest.state == "ready" and routable
        reason = message = ""
        if not ready and newest is not None:
            if newest.state == "not_ready":
                reason, message = newest.reason, newest.message
            elif newest.state == "unknown":
                reason, message = "RevisionMissing", f"revision {newest.name} is starting"
            else:
                reason, message = "TrafficNotReady", "a traffic target names a revision that is not ready"
        return WorkloadStatus(
            ref=ref,
            url=internal_url(ref),
            revisions=[self._revision_status(workload, r) for r in revisions],
            traffic=traffic,
            latest_created_revision=newest.name if newest else "",
            latest_ready_revision=latest_ready.name if latest_ready else "",
            ready=ready,
            reason=reason,
            message=message,
        )

    async def address(self, ref: WorkloadRef) -> str | None:
        return internal_url(ref) if self._workload(ref) is not None else None  # as `status` says it

    async def metrics(self, ref: WorkloadRef) -> WorkloadMetrics | None:
        status = await self.status(ref)
        workload = self._workload(ref)
        if status is None or workload is None:
            return None
        newest = workload.newest()
        target = DEFAULT_CONTAINER_CONCURRENCY
        if newest is not None and newest.spec.scaling.container_concurrency:
            target = newest.spec.scaling.container_concurrency
        return WorkloadMetrics(
            instances=sum(r.replicas for r in status.revisions),
            revisions=status.revisions,
            target_concurrency=target,
        )

    async def usage(self, namespace: str) -> dict[str, int]:
        pods = services = deployments = 0
        for workload in self._workloads.values():
            if workload.ref.namespace != namespace:
                continue
            for revision in workload.revisions.values():
                pods += sum(1 for i in revision.instances if not i.stopping)
                services += 2  # Knative keeps a public and a private service per revision
                deployments += 1
        return {"pods": pods, "services": services, "count/deployments.apps": deployments}

    async def spec_document(self, ref: WorkloadRef) -> dict[str, Any] | None:
        workload = self._workload(ref)
        status = await self.status(ref)
        if workload is None or status is None:
            return None
        newest = workload.newest()
        assert newest is not None
        spec = newest.spec
        secret_name = f"{ref.name}-secrets"
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(spec.env.items())]
        env += [
            {"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}}
            for k in sorted(spec.secret_env)
        ]
        container: dict[str, Any] = {
            "name": "user-container",
            "image": spec.image,
            "env": env,
            "ports": [{"name": spec.port_name, "containerPort": spec.port}],
            "resources": {k: dict(v) for k, v in (("requests", spec.resources.requests), ("limits", spec.resources.limits)) if v},
        }
        if spec.command:
            container["command"] = list(spec.command)
        if spec.args:
            container["args"] = list(spec.args)
        template_spec = knative_template_spec(
            container, concurrency=spec.scaling.container_concurrency, timeout_seconds=spec.timeout_seconds,
            runtime_class_name=spec.runtime_class_name, service_account_name=spec.service_account_name)
        metadata = {
            "name": ref.name,
            "namespace": ref.namespace,
            "labels": {"cai.platform/project": ref.project_id, "cai.platform/kind": ref.kind},
            "creationTimestamp": _rfc3339(workload.created_at),
            "generation": spec.generation,
        }
        return knative_service(
            metadata, revision=spec.revision, labels=dict(spec.labels), min_scale=spec.scaling.min_scale,
            max_scale=spec.scaling.max_scale, template_spec=template_spec,
            traffic=[_traffic_entry(t) for t in workload.traffic],
            status={
                "url": status.url,
                "latestCreatedRevisionName": status.latest_created_revision,
                "latestReadyRevisionName": status.latest_ready_revision,
                "observedGeneration": spec.generation,
                "conditions": [{
                    "type": "Ready",
                    "status": "True" if status.ready else ("Unknown" if newest.state == "unknown" else "False"),
                    "reason": status.reason,
                    "message": status.message,
                }],
                "traffic": [
                    _traffic_entry(TrafficTarget(t.percent, t.revision_name, t.latest_revision, t.tag)) | (
                        {"url": t.url} if t.url else {})
                    for t in status.traffic
                ],
            },
        )


def _traffic_entry(target: TrafficTarget) -> dict[str, Any]:
    entry: dict[str, Any] = {"percent": target.percent, "latestRevision": target.latest_revision}
    if target.revision_name:
        entry["revisionName"] = target.revision_name
    if target.tag:
        entry["tag"] = target.tag
    return entry


def _rfc3339(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
