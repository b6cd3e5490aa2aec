"""How a serverless service reads (document 3): its view with phase, conditions and revisions, and the
Knative Service document of its accepted spec. A layer of `ServerlessService` (`services/serverless.py`)."""

from __future__ import annotations

import builtins
from datetime import datetime
from typing import Any

from caiplatform.clock import rfc3339
from caiplatform.db.models.serverless import ServerlessRevision
from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.domain.serverless import TIMEOUT_ENV, ServiceSpec
from caiplatform.domain.spec_document import knative_service, knative_template_spec
from caiplatform.ports.runtime import RevisionStatus, WorkloadRef, WorkloadRuntime, WorkloadStatus
from caiplatform.routing import HostRouter
from caiplatform.services.access import ProjectRef

LOCAL_RUNTIMES = ("memory", "local")
CONDITION_TYPES = ("Ready", "ServiceReady", "VisibilityEnforced", "RuntimeClassApplied", "TrafficAccepted", "Exposed")


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


class ServiceViews:
    """The read side of the serverless service: what a view and the spec document say."""

    runtime: WorkloadRuntime
    hosts: HostRouter

    @staticmethod
    def ref(project: ProjectRef, name: str) -> WorkloadRef:
        return WorkloadRef(project.id, project.short, name, kind="service")

    def internal_host(self, project: ProjectRef, name: str) -> str:
        return f"{name}.{project.namespace}.svc.cluster.local"

    def _runnable(self, spec: ServiceSpec, revisions: list[ServerlessRevision]) -> bool:
        """Whether every revision the split names was handed to the runtime."""
        failed = {r.name for r in revisions if r.reason}
        return not any(e.revision_name in failed for e in spec.traffic)

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
