"""Workloads as Knative Serving Services: a revision of ours is a Knative Revision.

One Knative `Service` per workload, in the project's namespace. Every `apply` writes the Service's
`spec.template` (named after the revision, so Knative creates exactly that Revision), its traffic in
`spec.traffic`, scale bounds and concurrency as Knative's annotations and fields; secret values go into
a Secret per revision (`<revision>-env`) that the container references, never inline. Readiness, reason
and message are the Revision's and the Service's `Ready` condition; the URL is the Service's address
inside the cluster. Knative's activator and autoscaler do the request routing, cold starts and scaling,
so `acquire` only waits for a ready revision and hands out its address.

Knative Service names are one name space per namespace while ours has three (agents and functions,
services, MCP servers): a service or an MCP server is named `<name>-svc` / `<name>-mcp` on the cluster,
and its revisions `<name>-svc-00001` (mapped back to `<name>-00001` when read).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from datetime import datetime
from functools import partial
from typing import Any

import anyio
import httpx

from caiplatform.adapters.kubernetes.client import (
    KIND_LABEL,
    KNATIVE_GROUP,
    KNATIVE_VERSION,
    MERGE_PATCH,
    PART_LABEL,
    PROJECT_LABEL,
    WORKLOAD_LABEL,
    ClusterSettings,
    KubeClient,
    api_message,
    owned,
)
from caiplatform.ports.builder import Image
from caiplatform.ports.runtime import (
    Endpoint,
    LogLine,
    NoCapacity,
    ResolvedTraffic,
    RevisionSpec,
    RevisionStatus,
    TrafficTarget,
    WorkloadError,
    WorkloadMetrics,
    WorkloadRef,
    WorkloadRuntime,
    WorkloadStatus,
)

GENERATION_LABEL = "caiplatform.dev/generation"
HASH_ANNOTATION = "caiplatform.dev/revision-hash"
SERVICE_LABEL = "serving.knative.dev/service"
REVISION_LABEL = "serving.knative.dev/revision"
_KIND_SUFFIX = {"service": "-svc", "mcp": "-mcp"}


def knative_name(ref: WorkloadRef) -> str:
    return ref.name + _KIND_SUFFIX.get(ref.kind, "")


def knative_revision(ref: WorkloadRef, revision: str) -> str:
    return knative_name(ref) + revision[len(ref.name):]


def our_revision(ref: WorkloadRef, revision: str) -> str:
    return ref.name + revision[len(knative_name(ref)):]


def workload_labels(ref: WorkloadRef) -> dict[str, str]:
    return owned({PROJECT_LABEL: ref.project_id, WORKLOAD_LABEL: ref.name, KIND_LABEL: ref.kind})


def revision_hash(spec: RevisionSpec) -> str:
    """What makes a revision what it is; applying the same name with another hash is refused."""
    fields = asdict(spec)
    fields.pop("workload")
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


def replacing(old: Any, new: Any) -> Any:
    """A JSON merge patch that turns `old` into `new` (keys `new` lacks become null)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch = {key: replacing(old.get(key), value) for key, value in new.items()}
    patch.update({key: None for key in old if key not in new})
    return patch


def _routed(desired: list[dict[str, Any]], status: list[dict[str, Any]]) -> bool:
    """Whether the route's status carries the desired split (latest-revision entries resolved)."""
    if len(desired) != len(status):
        return False
    for want, have in zip(desired, status, strict=True):
        if want.get("percent") != have.get("percent") or want.get("tag") != have.get("tag"):
            return False
        if want.get("revisionName") and want["revisionName"] != have.get("revisionName"):
            return False
    return True


def _condition(obj: dict[str, Any], kind: str = "Ready") -> dict[str, Any]:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return {}


def _state(condition: dict[str, Any]) -> str:
    return {"True": "ready", "False": "not_ready"}.get(condition.get("status", ""), "unknown")


def _time(text: str | None) -> datetime:
    if not text:
        return datetime.now().astimezone()
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class KnativeRuntime(WorkloadRuntime):
    name = "kubernetes"

    def __init__(self, kube: KubeClient | None = None, *, settings: ClusterSettings | None = None,
                 images: Callable[[str], Awaitable[Image | None]] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, poll_seconds: float = 0.1,
                 settle_seconds: float = 10.0, **_: object):
        self.kube = kube or KubeClient(settings)
        self.images = images
        self.transport = transport  # None: the cluster's own network (the platform runs in the cluster)
        self.poll_seconds = poll_seconds
        self.settle_seconds = settle_seconds
        self._pods: dict[tuple[str, str], int] = {}  # the last observed instance count, for `logs`

    def _custom(self, verb: str) -> Any:
        return getattr(self.kube.custom, f"{verb}_namespaced_custom_object")

    async def _service(self, ref: WorkloadRef) -> dict[str, Any] | None:
        return await self.kube.get(self._custom("get"), KNATIVE_GROUP, KNATIVE_VERSION, ref.namespace, "services",
                                   knative_name(ref))

    async def _revisions(self, ref: WorkloadRef) -> list[dict[str, Any]]:
        return await self.kube.items(self._custom("list"), KNATIVE_GROUP, KNATIVE_VERSION, ref.namespace, "revisions",
                                     labels={SERVICE_LABEL: knative_name(ref)})

    # -- writing ------------------------------------------------------------------------------------
    def _template(self, spec: RevisionSpec, image: Image | None, secret_name: str) -> dict[str, Any]:
        ref = spec.workload
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in {**(image.env if image else {}), **spec.env}.items() if k != "PORT"]
        env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}} for k in sorted(spec.secret_env)]
        container: dict[str, Any] = {"name": "workload", "image": spec.image, "env": env,
                                     "ports": [{"containerPort": spec.port, "name": spec.port_name}]}
        command = spec.command if spec.command is not None else (image.command if image and image.command else None)
        if command:
            container["command"] = list(command)
        if spec.args is not None:
            container["args"] = list(spec.args)
        resources = {k: dict(v) for k, v in (("requests", spec.resources.requests), ("limits", spec.resources.limits)) if v}
        if resources:
            container["resources"] = resources
        annotations = {"autoscaling.knative.dev/min-scale": str(spec.scaling.min_scale), HASH_ANNOTATION: revision_hash(spec)}
        if spec.scaling.max_scale:
            annotations["autoscaling.knative.dev/max-scale"] = str(spec.scaling.max_scale)
        annotations.update({f"caiplatform.dev/label-{k}": str(v) for k, v in spec.labels.items()})
        pod: dict[str, Any] = {"containerConcurrency": spec.scaling.container_concurrency,
                               "timeoutSeconds": spec.timeout_seconds, "containers": [container]}
        if spec.runtime_class_name:
            pod["runtimeClassName"] = spec.runtime_class_name
        if spec.service_account_name:
            pod["serviceAccountName"] = spec.service_account_name
        return {"metadata": {"name": knative_revision(ref, spec.revision), "annotations": annotations,
                             "labels": {**workload_labels(ref), GENERATION_LABEL: str(spec.generation)}},
                "spec": pod}

    @staticmethod
    def _traffic(ref: WorkloadRef, traffic: list[TrafficTarget] | None) -> list[dict[str, Any]]:
        if traffic is None:
            return [{"percent": 100, "latestRevision": True}]
        entries = []
        for target in traffic:
            entry: dict[str, Any] = {"percent": target.percent}
            if target.latest_revision or not target.revision_name:
                entry["latestRevision"] = True
            else:
                entry["revisionName"] = knative_revision(ref, target.revision_name)
            if target.tag:
                entry["tag"] = target.tag
            entries.append(entry)
        return entries

    async def apply(self, spec: RevisionSpec, traffic: list[TrafficTarget] | None = None) -> None:
        ref = spec.workload
        name, revision = knative_name(ref), knative_revision(ref, spec.revision)
        current = await self._service(ref)
        if current is not None:
            hashes = {r["metadata"]["name"]: (r["metadata"].get("annotations") or {}).get(HASH_ANNOTATION)
                      for r in await self._revisions(ref)}
            template = current["spec"]["template"]["metadata"]
            hashes.setdefault(template["name"], (template.get("annotations") or {}).get(HASH_ANNOTATION))
            if revision in hashes:
                if hashes[revision] == revision_hash(spec):
                    return  # the same revision again changes nothing
                raise WorkloadError(f"revision {spec.revision} already exists; revisions are immutable")
        else:
            await self.kube.ensure_namespace(ref.namespace, ref.project_id)
        image = await self.images(spec.image) if self.images else None
        secret_name = f"{revision}-env"
        if spec.secret_env:
            secret = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                      "metadata": {"name": secret_name, "namespace": ref.namespace,
                                   "labels": {**workload_labels(ref), PART_LABEL: "revision-env", REVISION_LABEL: revision}},
                      "stringData": dict(spec.secret_env)}
            await self.kube.create_or_patch(partial(self.kube.core.create_namespaced_secret, ref.namespace),
                                            partial(self.kube.core.patch_namespaced_secret, secret_name, ref.namespace), secret)
        body: dict[str, Any] = {"apiVersion": f"{KNATIVE_GROUP}/{KNATIVE_VERSION}", "kind": "Service",
                "metadata": {"name": name, "namespace": ref.namespace, "labels": workload_labels(ref)},
                "spec": {"template": self._template(spec, image, secret_name), "traffic": self._traffic(ref, traffic)}}
        try:
            if current is None:
                await self.kube.call(self._custom("create"), KNATIVE_GROUP, KNATIVE_VERSION, ref.namespace, "services", body)
            else:
                patch = {"metadata": {"labels": body["metadata"]["labels"]},
                         "spec": {"template": replacing(current["spec"]["template"], body["spec"]["template"]),
                                  "traffic": body["spec"]["traffic"]}}
                await self._patch_service(ref, patch)
        except Exception as exc:
            raise WorkloadError(api_message(exc)) from exc  # shown as "rejected by the cluster: <message>"

    async def _patch_service(self, ref: WorkloadRef, patch: dict[str, Any]) -> None:
        await self.kube.call(self._custom("patch"), KNATIVE_GROUP, KNATIVE_VERSION, ref.namespace, "services",
                             knative_name(ref), patch, _content_type=MERGE_PATCH)

    async def set_traffic(self, ref: WorkloadRef, traffic: list[TrafficTarget]) -> None:
        """Replace the split, then wait (a few seconds at most) until Knative's route reports it, so a
        status read right after shows the new split as the other runtimes do."""
        if await self._service(ref) is None:
            raise LookupError(f"workload {ref.name} has no revision")
        desired = self._traffic(ref, traffic)
        await self._patch_service(ref, {"spec": {"traffic": desired}})
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline:
            service = await self._service(ref)
            if service is None or _routed(desired, (service.get("status") or {}).get("traffic") or []):
                return
            await asyncio.sleep(self.poll_seconds)

    # -- reading ------------------------------------------------------------------------------------
    async def status(self, ref: WorkloadRef) -> WorkloadStatus | None:
        service = await self._service(ref)
        if service is None:
            return None
        return self._status(ref, service, await self._revisions(ref))

    def _status(self, ref: WorkloadRef, service: dict[str, Any], revisions: list[dict[str, Any]]) -> WorkloadStatus:
        status = service.get("status") or {}
        traffic_status = status.get("traffic") or []
        share: dict[str, int] = {}
        tags: dict[str, tuple[str, str]] = {}
        for entry in traffic_status:
            if entry.get("revisionName"):
                share[entry["revisionName"]] = share.get(entry["revisionName"], 0) + int(entry.get("percent") or 0)
                if entry.get("tag"):
                    tags[entry["revisionName"]] = (entry["tag"], entry.get("url", ""))
        template = service["spec"]["template"]
        by_name = {r["metadata"]["name"]: r for r in revisions}
        if template["metadata"]["name"] not in by_name:  # Knative has not created it yet
            by_name[template["metadata"]["name"]] = {"metadata": template["metadata"], "spec": template["spec"]}
        listed = []
        for name, revision in by_name.items():
            meta, condition = revision["metadata"], _condition(revision)
            tag, tag_url = tags.get(name, (None, ""))
            state = _state(condition)
            listed.append(RevisionStatus(
                name=our_revision(ref, name), generation=int((meta.get("labels") or {}).get(GENERATION_LABEL, "0")),
                image=revision["spec"]["containers"][0]["image"], created_at=_time(meta.get("creationTimestamp")),
                state=state,  # type: ignore[arg-type]
                reason=condition.get("reason", "") if state != "ready" else "",
                message=condition.get("message", "") if state != "ready" else "",
                replicas=int((revision.get("status") or {}).get("actualReplicas") or 0),
                traffic_percent=share.get(name, 0), tag=tag, url=tag_url))
        listed.sort(key=lambda r: r.generation, reverse=True)
        self._pods[(ref.namespace, knative_name(ref))] = sum(r.replicas for r in listed)
        ready = _condition(service)
        spec_traffic = traffic_status or service["spec"].get("traffic") or []
        return WorkloadStatus(
            ref=ref, url=(status.get("address") or {}).get("url") or status.get("url", ""), revisions=listed,
            traffic=[ResolvedTraffic(percent=int(t.get("percent") or 0),
                                     revision_name=our_revision(ref, t["revisionName"]) if t.get("revisionName") else None,
                                     latest_revision=bool(t.get("latestRevision")), tag=t.get("tag"), url=t.get("url", ""))
                     for t in spec_traffic],
            latest_created_revision=our_revision(ref, status["latestCreatedRevisionName"]) if status.get("latestCreatedRevisionName") else "",
            latest_ready_revision=our_revision(ref, status["latestReadyRevisionName"]) if status.get("latestReadyRevisionName") else "",
            ready=_state(ready) == "ready", reason=ready.get("reason", ""), message=ready.get("message", ""))

    async def acquire(self, ref: WorkloadRef, *, timeout: float, tag: str | None = None) -> Endpoint:
        deadline = time.monotonic() + timeout
        while True:
            service = await self._service(ref)
            if service is None:
                raise LookupError(f"workload {ref.name} has no revision")
            if tag and not any(t.get("tag") == tag for t in service["spec"].get("traffic") or []):
                raise LookupError(f"workload {ref.name} has no traffic tag {tag!r}")
            current = self._status(ref, service, await self._revisions(ref))
            ready = {r.name for r in current.revisions if r.ready}
            routes = [t for t in current.traffic if t.revision_name in ready and (t.tag == tag if tag else t.percent > 0)]
            if routes:
                best = max(routes, key=lambda t: t.percent)

                async def release() -> None:
                    return None

                return Endpoint(revision=best.revision_name or "", base_url=best.url if tag else current.url,
                                release=release, transport=self.transport)
            if time.monotonic() >= deadline:
                raise NoCapacity(f"workload {ref.name} has no ready revision (waited {timeout:g} s)")
            await asyncio.sleep(min(self.poll_seconds, max(0.0, deadline - time.monotonic())))

    async def _pods_of(self, ref: WorkloadRef) -> list[dict[str, Any]]:
        return await self.kube.items(self.kube.core.list_namespaced_pod, ref.namespace,
                                     labels={SERVICE_LABEL: knative_name(ref)})

    def logs(self, ref: WorkloadRef, *, tail: int = 500, follow: bool = False) -> AsyncIterator[str] | None:
        """None when the last look at the workload (status, metrics) saw no instance: the port's call is
        synchronous, and a cluster cannot be asked without waiting."""
        if not self._pods.get((ref.namespace, knative_name(ref))):
            return None
        return self._stream(ref, tail, follow)

    async def _stream(self, ref: WorkloadRef, tail: int, follow: bool) -> AsyncIterator[str]:
        pods = await self._pods_of(ref)
        if not pods:
            return
        newest = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
        if not follow:
            text = await self.kube.call(self.kube.core.read_namespaced_pod_log, newest["metadata"]["name"],
                                        ref.namespace, container="workload", tail_lines=tail)
            for line in str(text or "").splitlines():
                yield line
            return
        # Following: the response stays open; lines are read in a worker thread as they arrive.
        response: Any = await anyio.to_thread.run_sync(lambda: self.kube.core.read_namespaced_pod_log(
            newest["metadata"]["name"], ref.namespace, container="workload", tail_lines=tail, follow=True,
            _preload_content=False))
        try:
            while True:
                raw = await anyio.to_thread.run_sync(response.readline, abandon_on_cancel=True)
                if not raw:
                    return
                yield raw.decode(errors="replace").rstrip("\n")
        finally:
            response.close()

    async def log_history(self, ref: WorkloadRef, *, since: datetime | None = None, limit: int = 500) -> list[LogLine]:
        """What the workload's pods still hold (a cluster keeps a pod's log while the pod exists)."""
        lines: list[LogLine] = []
        for pod in await self._pods_of(ref):
            meta = pod["metadata"]
            text = await self.kube.call(self.kube.core.read_namespaced_pod_log, meta["name"], ref.namespace,
                                        container="workload", timestamps=True)
            revision = our_revision(ref, (meta.get("labels") or {}).get(REVISION_LABEL, ""))
            for raw in str(text or "").splitlines():
                stamp, _, message = raw.partition(" ")
                try:
                    ts = _time(stamp)
                except ValueError:
                    continue
                if since is None or ts >= since:
                    lines.append(LogLine(ts=ts, revision=revision, pod=meta["name"], stream="stdout", message=message))
        lines.sort(key=lambda line: line.ts)
        return lines[-limit:] if limit else []

    async def spec_document(self, ref: WorkloadRef) -> dict[str, Any] | None:
        return await self._service(ref)

    async def metrics(self, ref: WorkloadRef) -> WorkloadMetrics | None:
        service = await self._service(ref)
        if service is None:
            return None
        current = self._status(ref, service, await self._revisions(ref))
        concurrency = int(service["spec"]["template"]["spec"].get("containerConcurrency") or 0)
        return WorkloadMetrics(instances=sum(r.replicas for r in current.revisions), revisions=current.revisions,
                               target_concurrency=concurrency)

    async def delete(self, ref: WorkloadRef) -> None:
        await self.kube.delete(self._custom("delete"), KNATIVE_GROUP, KNATIVE_VERSION, ref.namespace, "services",
                               knative_name(ref))
        for secret in await self.kube.items(self.kube.core.list_namespaced_secret, ref.namespace, labels=workload_labels(ref)):
            await self.kube.delete(self.kube.core.delete_namespaced_secret, secret["metadata"]["name"], ref.namespace)
        self._pods.pop((ref.namespace, knative_name(ref)), None)
        # The cluster's garbage collector removes revisions and their pods after the Service: wait (a few
        # seconds at most) so that usage read right after no longer counts them.
        deadline = time.monotonic() + self.settle_seconds
        while time.monotonic() < deadline and (await self._revisions(ref) or await self._pods_of(ref)):
            await asyncio.sleep(self.poll_seconds)

    async def usage(self, namespace: str) -> dict[str, int]:
        """The ResourceQuota's `status.used` (the cluster's own count). A resource the quota does not
        track (no hard: unlimited) or a namespace without a quota is counted from the objects."""
        from caiplatform.adapters.kubernetes.projects import QUOTA_NAME
        from caiplatform.quantity import parse_quantity

        quota = await self.kube.get(self.kube.core.read_namespaced_resource_quota, QUOTA_NAME, namespace)
        used = ((quota or {}).get("status") or {}).get("used") or {}
        usage = {r: parse_quantity(r, str(v)) for r, v in used.items()}
        core, apps = self.kube.core, self.kube.apps
        for resource, method in (("pods", core.list_namespaced_pod), ("services", core.list_namespaced_service),
                                 ("count/deployments.apps", apps.list_namespaced_deployment)):
            if resource not in usage:
                usage[resource] = len((await self.kube.call(method, namespace)).get("items") or [])
        return usage

    async def close(self) -> None:
        await self.kube.close()
