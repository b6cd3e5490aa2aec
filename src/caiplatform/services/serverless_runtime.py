"""How the serverless service drives the workload runtime (document 3): a revision handed to it (or why it
cannot start: images, config maps, secrets), the traffic split, published hosts, and the private hostnames
push delivery reaches. A layer of `ServerlessService` (`services/serverless.py`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caiplatform import json_input
from caiplatform.db import Database
from caiplatform.db.models import Project
from caiplatform.db.models.serverless import ServerlessRevision
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.domain.serverless import TIMEOUT_ENV, ServiceSpec, internal_host_label
from caiplatform.ports.runtime import Resources, RevisionSpec, Scaling, TrafficTarget, WorkloadRef
from caiplatform.routing import Upstream
from caiplatform.services.access import ProjectRef
from caiplatform.services.serverless_views import LOCAL_RUNTIMES, ServiceViews
from caiplatform.services.service_quota import services_hard

SecretReader = Callable[[str, str], Awaitable[str | None]]  # (project_id, secret name) → value or None
ImageResolver = Callable[[str], Awaitable[Any]]  # reference → the builder's Image, or None


def revision_name(service: str, number: int) -> str:
    return f"{service}-{number:05d}"


class _RevisionProblem(Exception):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def _upstream(endpoint: Any, timeout: float) -> Upstream:
    return Upstream(endpoint.base_url, endpoint.release, timeout, transport=endpoint.transport)


class RuntimeGlue(ServiceViews):
    """The serverless service's side of the runtime port, and of push delivery on one machine."""

    db: Database
    read_secret: SecretReader | None
    resolve_image: ImageResolver | None
    acquire_timeout: float
    triggers: Any
    push_targets: Any
    _transport: Any

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
        named = internal_host_label(host)
        if named is None:
            return None
        label, short = named

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
