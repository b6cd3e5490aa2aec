"""ServerlessService: the serverless API's services (document 3) over the workload runtime port.

The database holds what was accepted (the spec with defaults applied, the generation counters and
every immutable revision); the runtime holds what runs. Every change that touches the revision template
makes a new revision `<name>-0000N`; traffic and publishing changes only bump the generation. A
change the runtime refuses is undone here, so a failed write changes nothing.

On one machine the runtime runs only images this platform built (`registry.local/...`); any other
image is accepted and its revision reports `ImagePullBackOff` (see docs/decisions/serverless.md).
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, cast

import yaml
from sqlalchemy import CursorResult, Result, Table, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from caiplatform import json_input
from caiplatform.clock import Clock, rfc3339
from caiplatform.db import Database
from caiplatform.db.models import Project
from caiplatform.db.models.serverless import ServerlessRevision
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.domain.serverless import (
    CONCURRENT,
    NAME_TAKEN,
    NO_DATABASE,
    SERVICE_NOT_FOUND,
    TIMEOUT_ENV,
    ServiceSpec,
    apply_patch,
    parse_tail,
    parse_traffic,
    unknown_verb,
)
from caiplatform.domain.spec_document import knative_service, knative_template_spec, sanitize_spec
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound, PlatformError, Unavailable
from caiplatform.models import serverless as models
from caiplatform.pagination import Page, Pager, page_body
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
from caiplatform.principal import Principal
from caiplatform.routing import HostRouter, Upstream
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each
from caiplatform.services.service_quota import ServiceQuota, ServiceQuotaExceeded, services_hard

log = logging.getLogger(__name__)

SecretReader = Callable[[str, str], Awaitable[str | None]]  # (project_id, secret name) → value or None
ImageResolver = Callable[[str], Awaitable[Any]]  # reference → the builder's Image, or None

LOCAL_RUNTIMES = ("memory", "local")
NO_PODS = (
    "no running pods for service {name}: it is scaled to zero. Send a request to it first, "
    "then read the logs again.\n"
)
SPEC_NOTE = (
    "sanitized, read-only view of the live object: values of env keys matching "
    "(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE) are replaced with ***REDACTED***; "
    "env_from secrets are shown by reference only"
)
METRICS_NOTE = "live readout, no history: desired equals current on this runtime"
NOT_CONFIGURED = "not configured"
CONDITION_TYPES = ("Ready", "ServiceReady", "VisibilityEnforced", "RuntimeClassApplied", "TrafficAccepted", "Exposed")


def _table(model: type[Any]) -> Table:
    """A mapped class's table (declarative types `__table__` as any FromClause; these are Tables)."""
    return cast(Table, model.__table__)


def _rowcount(result: Result[Any]) -> int:
    """The rows an UPDATE matched: a DML statement's result is a CursorResult (Session.execute is typed
    for any statement)."""
    return cast(CursorResult[Any], result).rowcount


def quota_refusal(exc: ServiceQuotaExceeded) -> str:
    """The 400 for a revision that does not fit the project services quota. Document 3's error table has
    no quota row: on Kubernetes the quota admission refuses the revision's services, which this API
    reports as `rejected by the cluster: ...`, so one machine answers the same way."""
    return (
        f"rejected by the cluster: this project is at its service limit ({exc.used} / {exc.hard}): "
        f"a new revision holds {exc.needed} more services; delete a service or raise the project's "
        "service quota, then retry"
    )


def revision_name(service: str, number: int) -> str:
    return f"{service}-{number:05d}"


def _why(rev: RevisionStatus) -> tuple[str, str]:
    """A revision's reason and message; an image the one-machine runtime cannot pull says where it can."""
    message = rev.message
    if rev.reason == "ImagePullBackOff" and "Kubernetes" not in message:
        message = (message + "; " if message else "") + (
            "on one machine only images this platform built (registry.local/cai-...@sha256:...) run; "
            "the Kubernetes runtime pulls any other image from its registry")
    return rev.reason, message


def _tri(state: str) -> str:
    return {"ready": "True", "not_ready": "False"}.get(state, "Unknown")


class ServerlessService:
    def __init__(
        self,
        db: Database,
        access: Access,
        audit: AuditLog,
        clock: Clock,
        pager: Pager,
        runtime: WorkloadRuntime,
        hosts: HostRouter,
        *,
        read_secret: SecretReader | None = None,
        resolve_image: ImageResolver | None = None,
        acquire_timeout: float = 60.0,
        quota: ServiceQuota | None = None,
        signing_key_loaded: bool = True,
        sandbox_status: Callable[[], Mapping[str, object]] | None = None,
    ):
        self.db = db
        self.access = access
        self.audit = audit
        self.clock = clock
        self.pager = pager
        self.runtime = runtime
        self.hosts = hosts
        self.read_secret = read_secret
        self.resolve_image = resolve_image
        self.acquire_timeout = acquire_timeout
        # The project services quota, shared with the agents area (the platform passes one object).
        self.quota = quota if quota is not None else ServiceQuota(runtime.usage)
        # The triggers of this API (`TriggerService`), attached by the platform.
        self.triggers: Any = None
        # Where the messaging area's push delivery looks up `http://<service>.<namespace>` hosts
        # (`register(service, namespace, base_url, transport)`, `unregister(service, namespace)`); wired
        # by the platform when messaging is present.
        self.push_targets: Any = None
        self._transport: Any = None
        # For `/healthz`: whether sessions can be verified, and how local processes are confined.
        self.signing_key_loaded = signing_key_loaded
        self.sandbox_status = sandbox_status

    # ------------------------------------------------------------------------------------ helpers

    def require_caller(self, principal: Principal) -> None:
        """A credential that may manage resources (before a body is read); 503 without a database."""
        try:
            self.access.require_management(principal)
        except SQLAlchemyError as exc:
            log.warning("serverless: the caller could not be resolved: %s", exc)
            raise Unavailable(NO_DATABASE) from exc

    async def project(self, principal: Principal, project_id: str, *, admin: bool = False) -> ProjectRef:
        """The project gate (a malformed project id is 404); 503 without a database."""
        self.require_caller(principal)
        try:
            return await self.access.project_ref(principal, project_id, Role.ADMIN if admin else Role.MEMBER,
                                                 bad_id=NotFound)
        except SQLAlchemyError as exc:
            log.warning("serverless: project access could not be resolved: %s", exc)
            raise Unavailable(NO_DATABASE) from exc

    @staticmethod
    def ref(project: ProjectRef, name: str) -> WorkloadRef:
        return WorkloadRef(project.id, project.short, name, kind="service")

    @staticmethod
    def _row_sync(session: Session, project_id: str, name: str) -> ServiceRow:
        row = session.scalar(select(ServiceRow).where(ServiceRow.project_id == project_id, ServiceRow.name == name))
        if row is None:
            raise NotFound(SERVICE_NOT_FOUND)
        return row

    @staticmethod
    def _revisions_sync(session: Session, service_id: str) -> list[ServerlessRevision]:
        return list(session.scalars(
            select(ServerlessRevision).where(ServerlessRevision.service_id == service_id)
            .order_by(ServerlessRevision.number.desc())
        ))

    async def _load(self, project: ProjectRef, name: str) -> tuple[ServiceRow, list[ServerlessRevision]]:
        def run(session: Session) -> tuple[ServiceRow, list[ServerlessRevision]]:
            row = self._row_sync(session, project.id, name)
            return row, self._revisions_sync(session, row.id)

        return await self.db.run(run)

    def internal_host(self, project: ProjectRef, name: str) -> str:
        return f"{name}.{project.namespace}.svc.cluster.local"

    # ------------------------------------------------------------------------------------ runtime glue

    async def _problem(self, project: ProjectRef, template: dict[str, Any]) -> tuple[str, str] | None:
        """Why this revision cannot start at all, as a (reason, message) pair. Images are the runtime's
        business, except on one machine: there only images this platform's builder made run (a command
        override must not turn any other reference into a host process)."""
        image = template["image"]
        if self.runtime.name in LOCAL_RUNTIMES and self.resolve_image is not None:
            if await self.resolve_image(image) is None:
                return "ImagePullBackOff", (
                    f"the {self.runtime.name} runtime cannot pull {image}: on one machine only images this "
                    "platform built (registry.local/cai-<project>-<workload>@sha256:<digest>) run; "
                    "the Kubernetes runtime pulls any other image from its registry"
                )
        for entry in template.get("env_from", []):
            if entry.get("config_map_name") and not entry.get("optional"):
                return "CreateContainerConfigError", (
                    f"config map {entry['config_map_name']!r} not found: this runtime has no config maps; "
                    "mark it optional or use env"
                )
        return None

    async def _secret_env(self, project: ProjectRef, template: dict[str, Any]) -> dict[str, str]:
        """`env_from` secrets: a JSON-object value gives one variable per key, any other value one
        variable named after the secret (upper case, `-` → `_`)."""
        out: dict[str, str] = {}
        for entry in template.get("env_from", []):
            name = entry.get("secret_name")
            if not name:
                continue
            value = await self.read_secret(project.id, name) if self.read_secret else None
            if value is None:
                if entry.get("optional"):
                    continue
                raise _RevisionProblem("CreateContainerConfigError", f"secret {name!r} not found in this project")
            try:
                parsed = json_input.decode(value)
            except json_input.JSONInputError:
                parsed = None
            if isinstance(parsed, dict) and all(isinstance(v, str) for v in parsed.values()):
                out.update(parsed)
            else:
                out[name.upper().replace("-", "_")] = value
        return out

    def revision_spec(self, project: ProjectRef, name: str, number: int, template: dict[str, Any],
                      secret_env: dict[str, str]) -> RevisionSpec:
        spec = ServiceSpec.model_validate({"name": name, **template})
        env = dict(spec.env)
        env[TIMEOUT_ENV] = str(spec.timeout_seconds)
        return RevisionSpec(
            workload=self.ref(project, name),
            revision=revision_name(name, number),
            generation=number,
            image=spec.image,
            env=env,
            secret_env=secret_env,
            command=spec.command or None,
            args=spec.args or None,
            port=spec.port.container_port,
            port_name=spec.port.name,
            resources=Resources(requests=dict(spec.resources.get("requests", {})),
                                limits=dict(spec.resources.get("limits", {}))),
            scaling=Scaling(spec.scaling.min_scale, spec.scaling.max_scale, spec.scaling.container_concurrency),
            timeout_seconds=spec.timeout_seconds,
            runtime_class_name=spec.runtime_class_name,
            service_account_name=spec.service_account_name,
            labels={"serving.knative.dev/service": name},
        )

    @staticmethod
    def _targets(spec: ServiceSpec) -> list[TrafficTarget]:
        return [TrafficTarget(percent=e.percent, revision_name=e.revision_name or None,
                              latest_revision=e.latest_revision, tag=e.tag or None) for e in spec.traffic]

    def _runnable(self, spec: ServiceSpec, revisions: list[ServerlessRevision]) -> bool:
        """Whether every revision the split names was handed to the runtime."""
        failed = {r.name for r in revisions if r.reason}
        return not any(e.revision_name in failed for e in spec.traffic)

    async def _apply_revision(self, project: ProjectRef, row: ServiceRow, revision: ServerlessRevision,
                              revisions: list[ServerlessRevision], *, with_traffic: bool = True) -> None:
        """Hand a new revision to the runtime, or record why it cannot run (accepted, not ready)."""
        problem = await self._problem(project, revision.template)
        secret_env: dict[str, str] = {}
        if problem is None:
            try:
                secret_env = await self._secret_env(project, revision.template)
            except _RevisionProblem as exc:
                problem = (exc.reason, exc.message)
        if problem is not None:
            await self._mark_revision(row.id, revision.number, *problem)
            revision.reason, revision.message = problem
            return
        spec = ServiceSpec.model_validate(row.spec)
        targets = self._targets(spec) if with_traffic and self._runnable(spec, revisions) else None
        await self.runtime.apply(self.revision_spec(project, row.name, revision.number, revision.template, secret_env),
                                 targets)

    async def _push_traffic(self, project: ProjectRef, name: str, spec: ServiceSpec) -> None:
        try:
            await self.runtime.set_traffic(self.ref(project, name), self._targets(spec))
        except LookupError:
            # No revision reached the runtime yet (none could start): the split goes with the first one.
            pass

    async def _services_hard(self, project: ProjectRef) -> int:
        """The project's services quota, read when a revision is about to be made (0 = unlimited)."""
        settings = await self.db.run(lambda s: s.scalar(select(Project.settings).where(Project.id == project.id)))
        return services_hard(settings)

    async def _mark_revision(self, service_id: str, number: int, reason: str, message: str) -> None:
        def run(session: Session) -> None:
            rev = session.get(ServerlessRevision, (service_id, number))
            if rev is not None:
                rev.reason, rev.message = reason, message

        await self.db.run(run)

    async def _named_workload_exists(self, project: ProjectRef, name: str) -> bool:
        """An agent or function of the project holds `name`: in the cluster they are services of the same
        namespace (a trigger targets any of them by name), and they share the public hostname."""
        finder = getattr(self.triggers, "find_workload", None)
        return finder is not None and await finder(project.id, name) is not None

    def _publish(self, project: ProjectRef, spec: ServiceSpec) -> None:
        host = self.hosts.host_for(spec.name, project.short)
        if not spec.publish.enabled:
            self.hosts.unregister(host)
            return
        ref = self.ref(project, spec.name)
        timeout = float(spec.timeout_seconds)

        async def upstream() -> Upstream:
            endpoint = await self.runtime.acquire(ref, timeout=self.acquire_timeout)
            return _upstream(endpoint, timeout)

        self.hosts.register(host, upstream)

    # ------------------------------------------------------------------------------------ view

    def _conditions(self, spec: ServiceSpec, phase: str, status: WorkloadStatus | None,
                    latest: RevisionStatus | None, latest_row: ServerlessRevision | None,
                    traffic_ok: bool, since: datetime) -> list[dict[str, Any]]:
        when = rfc3339(latest.created_at if latest else since)

        def cond(kind: str, state: str, reason: str = "", message: str = "") -> dict[str, Any]:
            return {"type": kind, "status": state, "reason": reason, "message": message, "last_transition_time": when}

        ready_state = {"Ready": "True", "Pending": "Unknown"}.get(phase, "False")
        ready_reason = "" if phase == "Ready" else phase
        ready_message = ""
        if latest_row is not None and latest_row.reason:
            ready_reason, ready_message = latest_row.reason, latest_row.message
        elif latest is not None and latest.state != "ready":
            ready_reason, ready_message = _why(latest)
            ready_reason = ready_reason or phase
        elif status is not None and not status.ready and status.reason:
            ready_reason, ready_message = status.reason, status.message
        if latest_row is not None and latest_row.reason:
            service_ready = cond("ServiceReady", "False", latest_row.reason, latest_row.message)
        elif latest is not None:
            service_ready = cond("ServiceReady", _tri(latest.state), *_why(latest))
        else:
            service_ready = cond("ServiceReady", "Unknown", "Pending", "the runtime has not reported yet")
        visibility = ("Public", "reachable at its public address") if spec.publish.enabled else (
            "ClusterLocal", "reachable only inside the project's network")
        if spec.runtime_class_name:
            runtime_class = cond("RuntimeClassApplied", "False", "RuntimeClassUnavailable",
                                 f"the {self.runtime.name} runtime has no runtime class "
                                 f"{spec.runtime_class_name!r}; the workload runs without it") \
                if self.runtime.name in LOCAL_RUNTIMES else cond("RuntimeClassApplied", "True")
        else:
            runtime_class = cond("RuntimeClassApplied", "True", "NotRequested", "no runtime class was requested")
        traffic = cond("TrafficAccepted", "True") if traffic_ok else cond(
            "TrafficAccepted", "False", "RevisionFailed", "a revision the split names cannot run; fix it or change the split")
        if not spec.publish.enabled:
            exposed = cond("Exposed", "False", "NotPublished", "publish.enabled is false")
        elif phase in ("Ready", "Degraded"):
            exposed = cond("Exposed", "True")
        else:
            exposed = cond("Exposed", "Unknown", "NotReady", "the address answers once a revision is ready")
        return [
            cond("Ready", ready_state, ready_reason, ready_message),
            service_ready,
            cond("VisibilityEnforced", "True", *visibility),
            runtime_class,
            traffic,
            exposed,
        ]

    def _revision_views(self, rows: list[ServerlessRevision], status: WorkloadStatus | None) -> list[dict[str, Any]]:
        live = {r.name: r for r in (status.revisions if status else [])}
        out = []
        for row in rows:
            rev = live.get(row.name)
            if row.reason:
                ready, reason, message = "False", row.reason, row.message
            elif rev is not None:
                ready, (reason, message) = _tri(rev.state), _why(rev)
            else:
                ready, reason, message = "Unknown", "", ""
            out.append({
                "name": row.name,
                "generation": row.number,
                "image": (rev.image if rev is not None and rev.image else row.image),
                "ready": ready,
                "reason": reason,
                "message": message,
                "replicas": rev.replicas if rev else 0,
                "created_at": rfc3339(row.created_at),
                "traffic_percent": rev.traffic_percent if rev else 0,
                "tag": (rev.tag if rev else None) or "",
                "url": rev.url if rev else "",
            })
        return out

    def _phase(self, row: ServiceRow, rows: list[ServerlessRevision], status: WorkloadStatus | None) -> str:
        if row.apply_error:
            return "Invalid"
        latest_row = rows[0] if rows else None
        live = {r.name: r for r in (status.revisions if status else [])}
        any_ready = any(r.ready for r in live.values())
        if latest_row is not None and latest_row.reason:
            return "Degraded" if any_ready else "NotReady"
        latest = live.get(latest_row.name) if latest_row else None
        if status is None or latest is None or latest.state == "unknown":
            return "Pending"
        if latest.state == "ready":
            return "Ready"
        return "Degraded" if any_ready else "NotReady"

    def _view_body(self, project: ProjectRef, row: ServiceRow, rows: list[ServerlessRevision],
             status: WorkloadStatus | None) -> dict[str, Any]:
        spec = ServiceSpec.model_validate(row.spec)
        phase = self._phase(row, rows, status)
        live = {r.name: r for r in (status.revisions if status else [])}
        latest_row = rows[0] if rows else None
        latest = live.get(latest_row.name) if latest_row else None
        internal_url = f"http://{self.internal_host(project, row.name)}"
        public = self.hosts.public_url(row.name, project.short)
        body: dict[str, Any] = spec.model_dump()
        body["traffic"] = [e.to_json() for e in spec.traffic]
        body["project"] = f"projects/{project.short}/services/{row.name}"
        body["created_at"] = rfc3339(row.created_at)
        traffic = [
            {"revision_name": t.revision_name or "", "percent": t.percent, "tag": t.tag or "", "url": t.url}
            for t in (status.traffic if status else [])
        ]
        if not traffic:
            traffic = [{"revision_name": e.revision_name, "percent": e.percent, "tag": e.tag, "url": ""}
                       for e in spec.traffic]
        traffic_ok = self._runnable(spec, rows)
        latest_ready = status.latest_ready_revision if status else ""
        if not latest_ready:
            latest_ready = next((r.name for r in rows if live.get(r.name) is not None and live[r.name].ready), "")
        status_body: dict[str, Any] = {
            "url": public if spec.publish.enabled else internal_url,
            "internal_url": internal_url,
            "published": spec.publish.enabled,
            "latest_ready_revision": latest_ready,
            "latest_created_revision": latest_row.name if latest_row else "",
            "traffic": traffic,
            "phase": phase,
            "conditions": self._conditions(spec, phase, status, latest, latest_row, traffic_ok, row.updated_at),
            "observed_generation": row.observed_generation,
            "generation": row.generation,
        }
        if spec.publish.enabled and phase in ("Ready", "Degraded"):
            # One machine, no TLS (DECISIONS.md): the http:// address once it answers.
            status_body["external_url"] = self.hosts.public_url(row.name, project.short, scheme="http")
        if row.apply_error:
            status_body["message"] = row.apply_error
        body["status"] = status_body
        return body

    async def _view_of(self, project: ProjectRef, row: ServiceRow, rows: list[ServerlessRevision]) -> dict[str, Any]:
        status = await self.runtime.status(self.ref(project, row.name))
        return self._view_body(project, row, rows, status)

    # ------------------------------------------------------------------------------------ create / read

    async def create(self, principal: Principal, project_id: str, body: models.ServiceCreate) -> models.Service:
        """202 with the Service object; `status.phase` is `Pending` until the runtime reports."""
        project = await self.project(principal, project_id)
        spec = body.spec()
        if await self._named_workload_exists(project, spec.name):
            raise Conflict(NAME_TAKEN)
        now = self.clock.now()

        def insert(session: Session) -> tuple[ServiceRow, ServerlessRevision]:
            exists = session.scalar(select(ServiceRow.id).where(ServiceRow.project_id == project.id,
                                                                 ServiceRow.name == spec.name))
            if exists is not None:
                raise Conflict(NAME_TAKEN)
            row = ServiceRow(project_id=project.id, name=spec.name, spec=spec.model_dump(mode="json"), generation=1,
                             observed_generation=0, latest_revision=1, apply_error="", created_at=now, updated_at=now)
            session.add(row)
            session.flush()
            rev = ServerlessRevision(service_id=row.id, number=1, name=revision_name(spec.name, 1), image=spec.image,
                                     template=spec.template(), reason="", message="", created_at=now)
            session.add(rev)
            self.audit.record(session, project.id, principal, "serverless.service.create", spec.name,
                              {"image": spec.image})
            return row, rev

        try:
            row, rev = await self.db.run(insert)
        except IntegrityError:
            raise Conflict(NAME_TAKEN) from None
        try:
            async with self.quota.claim(project.id, project.namespace, await self._services_hard(project)):
                await self._apply_revision(project, row, rev, [rev])
        except ServiceQuotaExceeded as exc:
            await self._discard(project, row)
            raise BadRequest(quota_refusal(exc)) from None
        except WorkloadError as exc:
            await self._discard(project, row)
            raise BadRequest(f"rejected by the cluster: {exc.message}") from exc
        except PlatformError:
            await self._discard(project, row)
            raise
        except Exception as exc:
            await self._discard(project, row)
            raise InternalError(f"create service: {exc}") from exc
        row = await self._observed(row.id, 1)
        self._publish(project, spec)
        self._route_internal(project, spec.name, True)
        return models.Service.of(await self._view_of(project, row, [rev]))

    async def _observed(self, service_id: str, generation: int) -> ServiceRow:
        def run(session: Session) -> ServiceRow:
            row = session.get(ServiceRow, service_id)
            assert row is not None
            if row.observed_generation < generation:
                row.observed_generation = generation
            return row

        return await self.db.run(run)

    async def _discard(self, project: ProjectRef, row: ServiceRow) -> None:
        """Undo a create the runtime refused: nothing of it stays."""
        await self.db.run(lambda s: s.execute(_table(ServiceRow).delete().where(ServiceRow.id == row.id)))
        await self._forget(project, row.name)

    async def _forget(self, project: ProjectRef, name: str) -> None:
        self.hosts.unregister(self.hosts.host_for(name, project.short))
        try:
            await self.runtime.delete(self.ref(project, name))
        except Exception:  # noqa: BLE001 - cleanup after a failure; the runtime delete is idempotent
            log.warning("serverless: runtime cleanup of %s failed", name, exc_info=True)

    async def get(self, principal: Principal, project_id: str, name: str) -> models.Service:
        project = await self.project(principal, project_id)
        row, rows = await self._load(project, name)
        return models.Service.of(await self._view_of(project, row, rows))

    async def list(self, principal: Principal, project_id: str, *, page_size: Any = None,
                   page_token: str | None = None) -> models.ServiceList:
        """200 `{services, next_page_token?}`: the token is omitted on the last page."""
        project = await self.project(principal, project_id)
        request = self.pager.request(f"services:{project.id}", page_size, page_token)

        def run(session: Session) -> builtins.list[tuple[ServiceRow, builtins.list[ServerlessRevision]]]:
            rows = list(session.scalars(select(ServiceRow).where(ServiceRow.project_id == project.id)
                                        .order_by(ServiceRow.name).offset(request.offset).limit(request.size + 1)))
            return [(r, self._revisions_sync(session, r.id)) for r in rows]

        fetched = await self.db.run(run)
        page = self.pager.page_from_probe(fetched, request)
        items = [await self._view_of(project, row, rows) for row, rows in page.items]
        return models.ServiceList.of(
            page_body("services", Page(items, page.next_page_token, page.extra), omit_empty_token=True))

    async def revisions(self, principal: Principal, project_id: str, name: str) -> models.ServiceRevisionList:
        """200 `{revisions}`, newest first by generation, never paged."""
        project = await self.project(principal, project_id)
        row, rows = await self._load(project, name)
        status = await self.runtime.status(self.ref(project, name))
        return models.ServiceRevisionList.of({"revisions": self._revision_views(rows, status)})

    # ------------------------------------------------------------------------------------ changes

    async def patch(self, principal: Principal, project_id: str, name: str, patch: models.ServicePatch) -> models.Service:
        """Sparse update (200). A change to the revision template makes a new revision. A body that
        carries `generation` (as read) is refused with 409 when the service moved on since."""
        project = await self.project(principal, project_id)
        body = patch.changes()
        row, rows = await self._load(project, name)
        expected = body.get("generation", body.get("observed_generation"))
        if expected is not None and expected != row.generation:
            raise Conflict(CONCURRENT)
        current = ServiceSpec.model_validate(row.spec)
        existing = {r.name for r in rows}
        next_number = row.latest_revision + 1
        candidate = apply_patch(current, body, existing, revision_name(name, next_number))
        new_revision = candidate.template() != current.template()
        if not new_revision and "traffic" in body and body["traffic"] is not None:
            candidate.traffic = parse_traffic(body["traffic"], existing)
        old_generation = row.generation
        now = self.clock.now()

        def save(session: Session) -> tuple[ServiceRow, ServerlessRevision | None]:
            done = session.execute(
                update(ServiceRow).where(ServiceRow.id == row.id, ServiceRow.generation == old_generation).values(
                    spec=candidate.model_dump(mode="json"), generation=old_generation + 1,
                    latest_revision=next_number if new_revision else row.latest_revision,
                    apply_error="", updated_at=now)
            )
            if _rowcount(done) != 1:
                raise Conflict(CONCURRENT)
            rev = None
            if new_revision:
                rev = ServerlessRevision(service_id=row.id, number=next_number, name=revision_name(name, next_number),
                                         image=candidate.image, template=candidate.template(), reason="", message="",
                                         created_at=now)
                session.add(rev)
            self.audit.record(session, project.id, principal, "serverless.service.update", name,
                              {"generation": old_generation + 1, "revision": rev.name if rev else None})
            saved = session.get(ServiceRow, row.id)
            if saved is None:  # the update above matched it in this transaction
                raise Conflict(CONCURRENT)
            return saved, rev

        saved, rev = await self.db.run(save)
        try:
            if rev is not None:
                async with self.quota.claim(project.id, project.namespace, await self._services_hard(project)):
                    await self._apply_revision(project, saved, rev, [rev, *rows])
            elif candidate.traffic != current.traffic and self._runnable(candidate, rows):
                await self._push_traffic(project, name, candidate)
        except Exception as exc:
            await self._undo(row, rev, current, old_generation)
            if isinstance(exc, ServiceQuotaExceeded):
                raise BadRequest(quota_refusal(exc)) from None
            if isinstance(exc, WorkloadError):
                raise BadRequest(f"rejected by the cluster: {exc.message}") from exc
            raise
        saved = await self._observed(row.id, old_generation + 1)
        self._publish(project, candidate)
        return models.Service.of(await self._view_of(project, saved, ([rev] if rev else []) + rows))

    async def _undo(self, row: ServiceRow, rev: ServerlessRevision | None, spec: ServiceSpec, generation: int) -> None:
        """Put back what a refused change wrote (only if nobody changed the service since)."""

        def run(session: Session) -> None:
            current = session.get(ServiceRow, row.id)
            if current is None or current.generation != generation + 1:
                return
            current.spec = spec.model_dump(mode="json")
            current.generation = generation
            current.latest_revision = row.latest_revision
            if rev is not None:
                session.execute(_table(ServerlessRevision).delete().where(
                    ServerlessRevision.service_id == row.id, ServerlessRevision.number == rev.number))

        await self.db.run(run)

    def check_verb(self, principal: Principal, verb: str) -> None:
        """`POST .../services/{name}:<verb>`: the one verb is `set-traffic` (404 naming it otherwise)."""
        self.require_caller(principal)
        if verb != "set-traffic":
            raise NotFound(unknown_verb(verb))

    async def set_traffic(self, principal: Principal, project_id: str, name: str, body: models.TrafficUpdate) -> models.Service:
        """Replace the whole split (202 with the updated Service)."""
        project = await self.project(principal, project_id)
        row, rows = await self._load(project, name)
        traffic = parse_traffic([t.model_dump() for t in body.traffic], {r.name for r in rows}, required=True)
        current = ServiceSpec.model_validate(row.spec)
        candidate = current.model_copy(update={"traffic": traffic})
        old_generation = row.generation
        now = self.clock.now()

        def save(session: Session) -> ServiceRow:
            done = session.execute(
                update(ServiceRow).where(ServiceRow.id == row.id, ServiceRow.generation == old_generation)
                .values(spec=candidate.model_dump(mode="json"), generation=old_generation + 1, updated_at=now))
            if _rowcount(done) != 1:
                raise Conflict(CONCURRENT)
            self.audit.record(session, project.id, principal, "serverless.service.set_traffic", name,
                              {"traffic": [e.to_json() for e in traffic]})
            saved = session.get(ServiceRow, row.id)
            if saved is None:  # the update above matched it in this transaction
                raise Conflict(CONCURRENT)
            return saved

        await self.db.run(save)
        if self._runnable(candidate, rows):
            try:
                await self._push_traffic(project, name, candidate)
            except WorkloadError as exc:
                await self._undo(row, None, current, old_generation)
                raise BadRequest(f"rejected by the cluster: {exc.message}") from exc
        saved = await self._observed(row.id, old_generation + 1)
        return models.Service.of(await self._view_of(project, saved, rows))

    async def delete(self, principal: Principal, project_id: str, name: str) -> None:
        """Project admin only (the one 403 of this API); releases the public hostname."""
        project = await self.project(principal, project_id)
        row, _ = await self._load(project, name)
        await self.project(principal, project_id, admin=True)
        await self._remove(project, row, principal)

    async def _remove(self, project: ProjectRef, row: ServiceRow, principal: Principal | None) -> None:
        """Stop every instance of every revision, release the hostnames, drop the records (revisions
        cascade). `principal` None: the platform acts (a project delete)."""
        await self.runtime.delete(self.ref(project, row.name))
        self.hosts.unregister(self.hosts.host_for(row.name, project.short))
        self._route_internal(project, row.name, False)

        def run(session: Session) -> None:
            session.execute(_table(ServiceRow).delete().where(ServiceRow.id == row.id))
            self.audit.record(session, project.id, principal, "serverless.service.delete", row.name)

        await self.db.run(run)

    async def purge_project(self, project_id: str) -> int:
        """Remove everything of a project being deleted (for the projects area): its triggers (their push
        subscriptions and the project's buckets) and its services (instances, revisions, hostnames).
        Returns how many services and triggers were removed; a second call finds nothing."""

        def run(session: Session) -> tuple[ProjectRef, builtins.list[ServiceRow]] | None:
            project = session.get(Project, project_id)
            if project is None:
                return None
            rows = session.scalars(select(ServiceRow).where(ServiceRow.project_id == project_id).order_by(ServiceRow.name))
            return ProjectRef.of(project), list(rows)

        found = await self.db.run(run)
        if found is None:
            return 0
        project, rows = found
        triggers = await self.triggers.purge(project) if self.triggers is not None else 0
        services = await remove_each("service", rows, lambda row: row.name, lambda row: self._remove(project, row, None))
        return triggers + services

    # ------------------------------------------------------------------------------------ observe

    async def logs(self, principal: Principal, project_id: str, name: str, *, tail: Any = None,
                   follow: bool = False) -> AsyncIterator[str]:
        """Checks first (so errors are JSON), then the lines of the newest instance as text."""
        lines_wanted = parse_tail(tail)
        project = await self.project(principal, project_id)
        await self._load(project, name)
        stream = self.runtime.logs(self.ref(project, name), tail=lines_wanted, follow=follow)
        return _log_text(name, stream)

    def _spec_document(self, project: ProjectRef, row: ServiceRow, rows: builtins.list[ServerlessRevision],
                      status: WorkloadStatus | None) -> dict[str, Any]:
        """A Knative-Service-shaped document of the accepted spec (secrets by reference only)."""
        spec = ServiceSpec.model_validate(row.spec)
        container: dict[str, Any] = {"image": spec.image}
        if spec.command:
            container["command"] = spec.command
        if spec.args:
            container["args"] = spec.args
        container["env"] = [{"name": k, "value": v} for k, v in spec.env.items()] + [
            {"name": TIMEOUT_ENV, "value": str(spec.timeout_seconds)}]
        if spec.env_from:
            container["envFrom"] = [
                {"secretRef": {"name": e.secret_name, "optional": e.optional}} if e.secret_name
                else {"configMapRef": {"name": e.config_map_name, "optional": e.optional}} for e in spec.env_from]
        container["ports"] = [{"name": spec.port.name, "containerPort": spec.port.container_port}]
        container["resources"] = spec.resources
        template_spec = knative_template_spec(
            container, concurrency=spec.scaling.container_concurrency, timeout_seconds=spec.timeout_seconds,
            runtime_class_name=spec.runtime_class_name, service_account_name=spec.service_account_name)
        view = self._view_body(project, row, rows, status)
        labels = {} if spec.publish.enabled else {"networking.knative.dev/visibility": "cluster-local"}
        metadata = {"name": row.name, "namespace": project.namespace, "generation": row.generation,
                    "labels": labels, "creationTimestamp": rfc3339(row.created_at)}
        traffic = [
            {k: v for k, v in (("revisionName", e.revision_name), ("latestRevision", e.latest_revision),
                               ("percent", e.percent), ("tag", e.tag)) if v not in ("", None)}
            | {"latestRevision": e.latest_revision, "percent": e.percent}
            for e in spec.traffic
        ]
        return knative_service(metadata, revision=rows[0].name if rows else "", labels=None,
                               min_scale=spec.scaling.min_scale, max_scale=spec.scaling.max_scale,
                               template_spec=template_spec, traffic=traffic, status={
            "observedGeneration": row.observed_generation,
            "url": view["status"]["url"],
            "latestCreatedRevisionName": view["status"]["latest_created_revision"],
            "latestReadyRevisionName": view["status"]["latest_ready_revision"],
            "conditions": [{"type": c["type"], "status": c["status"], "reason": c["reason"],
                            "message": c["message"]} for c in view["status"]["conditions"]],
        })

    async def spec(self, principal: Principal, project_id: str, name: str) -> models.ServiceSpecDocument:
        """200 `{service, yaml, note}` with sensitive env values replaced by `***REDACTED***`."""
        project = await self.project(principal, project_id)
        row, rows = await self._load(project, name)
        status = await self.runtime.status(self.ref(project, name))
        document = sanitize_spec(self._spec_document(project, row, rows, status))
        return models.ServiceSpecDocument(service=name, yaml=yaml.safe_dump(document, sort_keys=False), note=SPEC_NOTE)

    async def metrics(self, principal: Principal, project_id: str, name: str) -> models.ServiceMetrics:
        project = await self.project(principal, project_id)
        row, rows = await self._load(project, name)
        ref = self.ref(project, name)
        status = await self.runtime.status(ref)
        metrics = await self.runtime.metrics(ref)
        view = self._view_body(project, row, rows, status)
        live = {r.name: r for r in (metrics.revisions if metrics else status.revisions if status else [])}
        current = metrics.instances if metrics else sum(r.replicas for r in live.values())
        revisions = []
        for rev in self._revision_views(rows, status):
            running = live.get(rev["name"])
            revisions.append({
                "name": rev["name"],
                "generation": rev["generation"],
                "replicas": running.replicas if running else 0,
                "ready": rev["ready"] == "True",
                "traffic_percent": running.traffic_percent if running else 0,
                "latest_ready": rev["name"] == view["status"]["latest_ready_revision"],
                "latest_created": rev["name"] == view["status"]["latest_created_revision"],
            })
        ready = view["status"]["conditions"][0]
        return models.ServiceMetrics.of({
            "service": name,
            "instances": {"current": current, "desired": current},
            "revisions": revisions,
            "phase": view["status"]["phase"],
            "readiness": {"ready": ready["status"] == "True", "reason": ready["reason"], "message": ready["message"],
                          "last_transition_time": ready["last_transition_time"]},
            "scaling": view["scaling"],
            "note": METRICS_NOTE,
        })

    # ------------------------------------------------------------------------------------ health

    async def health(self) -> tuple[int, models.ServerlessHealth]:
        """Always 200; `status` says whether every dependency answers.

        Without a cluster the `kubernetes` and `crd` slots say `not configured` (with the local runtime's
        name in `kubernetes_detail` and `runtime`): what is true, never a bare `ok` for something unused."""
        body: dict[str, Any] = {"status": "ok", "service": "serverless"}
        try:
            self.db.ping()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            body["database"], body["database_detail"] = "unreachable", str(exc)
        else:
            body["database"] = "ok"
        body["sessions"] = "ok" if self.signing_key_loaded else "unavailable"
        body["kubernetes"] = body["crd"] = NOT_CONFIGURED
        if not self.signing_key_loaded:
            body["sessions_detail"] = "no session signing key is loaded"
        try:
            runtime_name = self.runtime.name
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            body["kubernetes"] = "unreachable"
            body["kubernetes_detail"] = f"the workload runtime is not available: {exc}"
        else:
            body["runtime"] = runtime_name
            if runtime_name == "kubernetes":
                body["kubernetes"] = body["crd"] = "ok"  # the runtime adapter answered for its cluster
            else:
                body["kubernetes_detail"] = f"no cluster is configured; services run on the {runtime_name} runtime"
                body["crd_detail"] = "no cluster is configured; service records live in the platform database"
            if runtime_name == "local" and self.sandbox_status is not None:  # say how deployed code is confined
                body["sandbox"] = dict(self.sandbox_status())
        if body["database"] == "ok":
            try:
                await self.db.run(lambda s: s.execute(select(ServiceRow.id).limit(1)))
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                body["crd"] = "missing"
                body["crd_detail"] = f"the serverless tables are missing: {exc}"
        else:
            body["crd"] = "missing"
            body["crd_detail"] = "the database is unreachable"
        healthy = ("ok", NOT_CONFIGURED)
        if any(body[k] not in healthy for k in ("database", "sessions", "kubernetes", "crd")):
            body["status"] = "degraded"
        return 200, models.ServerlessHealth.of(body)

    # ------------------------------------------------------------------------------------ platform

    async def start(self) -> None:
        """After a restart: hand the runtime back every accepted service it does not know, and
        re-register published hosts."""

        def run(session: Session) -> builtins.list[tuple[ProjectRef, ServiceRow, builtins.list[ServerlessRevision]]]:
            out = []
            for row in session.scalars(select(ServiceRow)):
                project = session.get(Project, row.project_id)
                if project is not None:
                    out.append((ProjectRef.of(project), row, self._revisions_sync(session, row.id)))
            return out

        for project, row, rows in await self.db.run(run):
            spec = ServiceSpec.model_validate(row.spec)
            self._publish(project, spec)
            self._route_internal(project, row.name, True)
            try:
                if await self.runtime.status(self.ref(project, row.name)) is None:
                    # Oldest first, so that the newest is the runtime's latest revision again; the split
                    # goes last, once every revision it names exists.
                    for rev in reversed(rows):
                        if not rev.reason:
                            await self._apply_revision(project, row, rev, rows, with_traffic=False)
                    if self._runnable(spec, rows):
                        await self._push_traffic(project, row.name, spec)
            except Exception:  # noqa: BLE001 - one broken service must not keep the platform down
                log.exception("serverless: could not restore %s", row.name)

    def internal_transport(self, fallback: Any = None) -> Any:
        """An httpx transport that delivers requests for services' private hostnames through the runtime
        (and anything else to `fallback`, the network by default): what push delivery uses on one machine."""
        from caiplatform.web.internal_transport import InternalTransport

        on_delivery = self.triggers.record_push if self.triggers is not None else None
        return InternalTransport(self.resolve_internal, self.runtime, fallback, on_delivery=on_delivery)

    def _route_internal(self, project: ProjectRef, name: str, present: bool) -> None:
        """Tell push delivery where this service's private hostname goes (or that it is gone)."""
        if self.push_targets is None:
            return
        if not present:
            self.push_targets.unregister(name, project.namespace)
            return
        if self._transport is None:
            self._transport = self.internal_transport()
        self.push_targets.register(name, project.namespace, f"http://{self.internal_host(project, name)}",
                                   self._transport)

    async def resolve_internal(self, host: str) -> tuple[WorkloadRef, float, str | None] | None:
        """`[<tag>-]<service>.<namespace>[.svc[.cluster.local]]` of a serverless service → its workload,
        its request timeout and the traffic tag the host names (None: the split decides)."""
        parts = host.lower().split(":", 1)[0].split(".")
        if len(parts) not in (2, 3, 5) or not parts[1].startswith("cai-p-"):
            return None
        if parts[2:] not in ([], ["svc"], ["svc", "cluster", "local"]):
            return None
        label, short = parts[0], parts[1][len("cai-p-"):]

        def run(session: Session) -> tuple[WorkloadRef, float, str | None] | None:
            project = session.scalar(select(Project).where(Project.short == short))
            if project is None:
                return None
            rows = session.scalars(select(ServiceRow).where(ServiceRow.project_id == project.id)).all()
            for row in sorted(rows, key=lambda r: len(r.name), reverse=True):
                tag = None
                if label != row.name:
                    tag = label.removesuffix("-" + row.name) if label.endswith("-" + row.name) else ""
                    if not tag or tag not in {e.get("tag") for e in row.spec.get("traffic", [])}:
                        continue
                ref = WorkloadRef(project.id, project.short, row.name, kind="service")
                return ref, float(row.spec.get("timeout_seconds", 300)), tag
            return None

        return await self.db.run(run)


class _RevisionProblem(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _upstream(endpoint: Any, timeout: float) -> Upstream:
    return Upstream(endpoint.base_url, endpoint.release, timeout, transport=endpoint.transport)


async def _log_text(name: str, stream: AsyncIterator[str] | None) -> AsyncIterator[str]:
    if stream is None:
        yield NO_PODS.format(name=name)
        return
    try:
        async for line in stream:
            yield line if line.endswith("\n") else line + "\n"
    except Exception as exc:  # noqa: BLE001 - the spec's final line carries the reason
        yield f"[log stream ended: {exc or type(exc).__name__}]\n"
