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
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

import yaml
from sqlalchemy import CursorResult, Result, Table, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from caiplatform.clock import Clock
from caiplatform.db import Database
from caiplatform.db.models import Project
from caiplatform.db.models.serverless import ServerlessRevision
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.domain.serverless import (
    CONCURRENT,
    NAME_TAKEN,
    NO_DATABASE,
    SERVICE_NOT_FOUND,
    ServiceSpec,
    apply_patch,
    parse_tail,
    parse_traffic,
    unknown_verb,
)
from caiplatform.domain.spec_document import sanitize_spec
from caiplatform.errors import BadRequest, Conflict, InternalError, NotFound, PlatformError, Unavailable
from caiplatform.models import serverless as models
from caiplatform.models.base import BodyOrReader, body_after_gate
from caiplatform.pagination import Page, Pager, page_body
from caiplatform.ports.runtime import (
    WorkloadError,
    WorkloadRuntime,
)
from caiplatform.principal import Principal
from caiplatform.routing import HostRouter
from caiplatform.services.access import Access, ProjectRef, Role
from caiplatform.services.audit import AuditLog
from caiplatform.services.purge import remove_each
from caiplatform.services.serverless_runtime import (
    ImageResolver,
    RuntimeGlue,
    SecretReader,
    revision_name,
)
from caiplatform.services.service_quota import ServiceQuota, ServiceQuotaExceeded

log = logging.getLogger(__name__)


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


class ServerlessService(RuntimeGlue):
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

    # ------------------------------------------------------------------------------------ create / read

    async def create(self, principal: Principal, project_id: str,
                     body: BodyOrReader[models.ServiceCreate]) -> models.Service:
        """202 with the Service object; `status.phase` is `Pending` until the runtime reports."""
        project = await self.project(principal, project_id)
        body = await body_after_gate(body)
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

    async def set_traffic(self, principal: Principal, project_id: str, name: str,
                          body: BodyOrReader[models.TrafficUpdate]) -> models.Service:
        """Replace the whole split (202 with the updated Service)."""
        project = await self.project(principal, project_id)
        body = await body_after_gate(body)
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


async def _log_text(name: str, stream: AsyncIterator[str] | None) -> AsyncIterator[str]:
    if stream is None:
        yield NO_PODS.format(name=name)
        return
    try:
        async for line in stream:
            yield line if line.endswith("\n") else line + "\n"
    except Exception as exc:  # noqa: BLE001 - the spec's final line carries the reason
        yield f"[log stream ended: {exc or type(exc).__name__}]\n"
