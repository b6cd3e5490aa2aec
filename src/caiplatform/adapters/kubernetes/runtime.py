"""Workloads as Knative Serving Services: a revision of ours is a Knative Revision.

One Knative `Service` per workload, in the project's namespace. Every `apply` writes the Service's
`spec.template` (named after the revision, so Knative creates exactly that Revision), its traffic in
`spec.traffic`, scale bounds and concurrency as Knative's annotations and fields; secret values go into
a Secret per revision (`<revision>-env`) that the container references, never inline. Readiness, reason
and message are the Revision's and the Service's `Ready` condition; the URL is the Service's address
inside the cluster. Knative's activator and autoscaler do the request routing, cold starts and scaling,
so `acquire` only waits for a ready revision and hands out its address.

Log history: a cluster keeps a pod's log only while the pod exists, so with a `history_dir` the runtime
keeps what the platform's history promises (`LOG_RETENTION`, as the local runtime does): a collector
started by `start()` reads the new lines of every workload pod (`timestamps=true`, each pod from the last
line it stored) every `log_poll_seconds` into `<history_dir>/<workload key>.jsonl`, `log_history`
collects the workload's live pods once more and answers from those files, so a revision whose pods are
gone (scaled to zero, superseded) still shows what it wrote. Lines a pod writes in its last poll interval
before it is removed can be missed. Several control-plane replicas each collect; lines are told apart by
pod, time and text, so a history directory on a shared volume holds each line once in every answer.

Knative Service names are one name space per namespace while ours has three (agents and functions,
services, MCP servers): a service or an MCP server is named `<name>-svc` / `<name>-mcp` on the cluster,
and its revisions `<name>-svc-00001` (mapped back to `<name>-00001` when read).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx

from caiplatform import logjson, tracing
from caiplatform.adapters.instances import DEFAULT_LOG_RETENTION, parse_duration
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
from caiplatform.adapters.log_files import erase_lines
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

log = logging.getLogger(__name__)

GENERATION_LABEL = "caiplatform.dev/generation"
HASH_ANNOTATION = "caiplatform.dev/revision-hash"
# A revision's `RevisionSpec.labels` (keys such as `cai.dev/agent` hold a `/` of their own, so they cannot
# be suffixes of an annotation key: apimachinery's `IsQualifiedName` admits one `/`), as one JSON object.
LABELS_ANNOTATION = "caiplatform.dev/labels"
RUNTIME_CLASS_FEATURE = "kubernetes.podspec-runtimeclassname"
# Knative names a revision `<service>-<suffix>` and refuses any other name; both are DNS-1035 labels of at
# most 63 characters (knative/serving `pkg/apis/serving/v1/revision_validation.go`). A revision suffix is
# `-NNNNN`, so a Knative Service's name has at most 57.
KNATIVE_NAME_MAX = 63 - len("-00000")
SERVICE_LABEL = "serving.knative.dev/service"
REVISION_LABEL = "serving.knative.dev/revision"
_KIND_SUFFIX = {"service": "-svc", "mcp": "-mcp"}
NAMESPACE_PREFIX = "cai-p-"  # `WorkloadRef.namespace`
COMPACT_EVERY_SECONDS = 600.0
FOLLOW_READ_TIMEOUT_SECONDS = 86400.0


def knative_name(ref: WorkloadRef) -> str:
    """The Knative Service's name: the workload's, with its kind's suffix; a name too long to carry a
    revision suffix keeps its first 50 characters and a hash of the whole (stable, and distinct)."""
    name = ref.name + _KIND_SUFFIX.get(ref.kind, "")
    if len(name) <= KNATIVE_NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:KNATIVE_NAME_MAX - 51]
    return f"{name[:50].rstrip('-')}-{digest}"


def revision_labels(template: dict[str, Any]) -> dict[str, str]:
    """The `RevisionSpec.labels` a template (or a revision's metadata) records."""
    raw = ((template.get("metadata") or template).get("annotations") or {}).get(LABELS_ANNOTATION)
    try:
        labels = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


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
    # Labels say who applied it and why (`cai.dev/reason`): another replica applying the same revision for
    # another reason applies the same revision.
    fields.pop("labels")
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


def _routed_revisions(service: dict[str, Any], tag: str | None) -> list[str]:
    """The Knative revisions the Service's traffic sends requests to (the tag's, with `tag`): the named
    ones, and for a latest-revision entry the latest created (the template's)."""
    latest = ((service.get("status") or {}).get("latestCreatedRevisionName")
              or service["spec"]["template"]["metadata"]["name"])
    names = []
    for entry in service["spec"].get("traffic") or [{"percent": 100, "latestRevision": True}]:
        if (entry.get("tag") == tag) if tag else int(entry.get("percent") or 0) > 0:
            name = entry.get("revisionName") if not entry.get("latestRevision") else latest
            if name and name not in names:
                names.append(name)
    return names


def _changed(seen: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether a Knative Service's spec or status is no longer what was seen."""
    return (now.get("spec"), now.get("status")) != (seen.get("spec"), seen.get("status"))


def _state(condition: dict[str, Any]) -> str:
    return {"True": "ready", "False": "not_ready"}.get(condition.get("status", ""), "unknown")


def _time(text: str | None) -> datetime:
    if not text:
        return datetime.now().astimezone()
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class KnativeRuntime(WorkloadRuntime):
    name = "kubernetes"
    shared = True

    def __init__(self, kube: KubeClient | None = None, *, settings: ClusterSettings | None = None,
                 images: Callable[[str], Awaitable[Image | None]] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 settle_seconds: float = 10.0, history_dir: str | Path | None = None,
                 log_retention: timedelta | str = DEFAULT_LOG_RETENTION, log_poll_seconds: float = 10.0, **_: object):
        self.kube = kube or KubeClient(settings)
        self.images = images
        self.transport = transport  # None: the cluster's own network (the platform runs in the cluster)
        self.settle_seconds = settle_seconds
        self._pods: dict[tuple[str, str], int] = {}  # the last observed instance count, for `logs`
        # Log history (see the module doc): None keeps none beyond what the pods hold.
        self.history_dir = Path(history_dir) if history_dir is not None else None
        self.log_retention = parse_duration(log_retention) if isinstance(log_retention, str) else log_retention
        self.log_poll_seconds = log_poll_seconds
        self._stored: dict[str, dict[str, datetime]] = {}  # workload key -> pod -> its newest stored line
        self._history_lock = asyncio.Lock()
        self._collector: asyncio.Task[None] | None = None
        self._last_compaction = time.monotonic()

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
        # After the tenant's variables, which never name them: the traces endpoint and the log format, as the
        # local runtime gives its instances (fixed per revision: a revision's template is never rewritten).
        ours = self._observability_env()
        env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in {**(image.env if image else {}), **spec.env}.items()
                                     if k != "PORT" and k not in ours]
        env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": k}}} for k in sorted(spec.secret_env)
                if k not in ours]
        env += [{"name": k, "value": v} for k, v in ours.items() if v]
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
        if spec.labels:
            annotations[LABELS_ANNOTATION] = json.dumps({k: str(v) for k, v in spec.labels.items()}, sort_keys=True)
        pod: dict[str, Any] = {"containerConcurrency": spec.scaling.container_concurrency,
                               "timeoutSeconds": spec.timeout_seconds, "containers": [container]}
        if spec.runtime_class_name:
            pod["runtimeClassName"] = spec.runtime_class_name
        if spec.service_account_name:
            pod["serviceAccountName"] = spec.service_account_name
        return {"metadata": {"name": knative_revision(ref, spec.revision), "annotations": annotations,
                             "labels": {**workload_labels(ref), GENERATION_LABEL: str(spec.generation)}},
                "spec": pod}

    def _observability_env(self) -> dict[str, str]:
        return {**tracing.cluster_workload_env(self.kube.settings.otel_endpoint), **logjson.workload_env()}

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

    async def settled(self, ref: WorkloadRef, revision: str, timeout: float) -> None:
        """Wait, watching (not polling), until the Knative revision for `revision` exists and its `Ready`
        condition is decided (True or False), or `timeout` passes; the caller reads the status then."""
        await self._decided(ref.namespace, knative_revision(ref, revision), timeout)

    async def _decided(self, namespace: str, name: str, timeout: float) -> None:
        """Wait (watching) until the Knative revision `name` exists with its `Ready` decided, or `timeout`."""
        with contextlib.suppress(TimeoutError, LookupError):
            await self.kube.wait_for(self._lister("revisions"), namespace, name,
                                     lambda obj: _condition(obj).get("status") in ("True", "False"), timeout)

    def _lister(self, plural: str) -> Callable[..., Any]:
        """The list call of a Knative resource, shaped as `KubeClient.wait_for` calls it (namespace first)."""
        def list_objects(namespace: str, **kwargs: Any) -> Any:
            return self.kube.custom.list_namespaced_custom_object(KNATIVE_GROUP, KNATIVE_VERSION, namespace, plural,
                                                                  **kwargs)

        return list_objects

    async def _await_service(self, ref: WorkloadRef, done: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The Knative Service once `done(service)` holds, watched from a list (`KubeClient.wait_for`):
        `TimeoutError`, or `LookupError` when it is deleted meanwhile."""
        return await self.kube.wait_for(self._lister("services"), ref.namespace, knative_name(ref), done, timeout)

    def _check_admissible(self, spec: RevisionSpec) -> None:
        """Refuse, before anything is written, what Knative's webhook would refuse with the cluster's flags."""
        if spec.runtime_class_name and RUNTIME_CLASS_FEATURE not in self.kube.settings.knative_features:
            # Dropping the field would run the workload outside the boundary it asked for: fail and say why.
            raise WorkloadError(
                f"runtime class {spec.runtime_class_name!r} needs Knative's {RUNTIME_CLASS_FEATURE} feature: "
                "enable it in the knative-serving namespace's config-features ConfigMap and set "
                f"CAI_KNATIVE_FEATURES={RUNTIME_CLASS_FEATURE} on the platform")

    async def apply(self, spec: RevisionSpec, traffic: list[TrafficTarget] | None = None) -> None:
        self._check_admissible(spec)
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
        with contextlib.suppress(TimeoutError, LookupError):  # not settled in time, or deleted: read as it is
            await self._await_service(ref, lambda service: _routed(desired, (service.get("status") or {}).get("traffic") or []),
                                      self.settle_seconds)

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
        """The address of a ready revision the traffic routes to (the tag's, with `tag`), waiting up to
        `timeout` for one. The wait watches, never re-reads: while a revision the traffic names is
        undecided (starting), that revision; once every one is decided, the Knative Service, whose status
        changes when its route or a revision's readiness does."""
        deadline = time.monotonic() + timeout
        while True:
            service = await self._service(ref)
            if service is None:
                raise LookupError(f"workload {ref.name} has no revision")
            if tag and not any(t.get("tag") == tag for t in service["spec"].get("traffic") or []):
                raise LookupError(f"workload {ref.name} has no traffic tag {tag!r}")
            revisions = await self._revisions(ref)
            current = self._status(ref, service, revisions)
            ready = {r.name for r in current.revisions if r.ready}
            routes = [t for t in current.traffic if t.revision_name in ready and (t.tag == tag if tag else t.percent > 0)]
            if routes:
                best = max(routes, key=lambda t: t.percent)

                async def release() -> None:
                    return None

                return Endpoint(revision=best.revision_name or "", base_url=best.url if tag else current.url,
                                release=release, transport=self.transport)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoCapacity(f"workload {ref.name} has no ready revision (waited {timeout:g} s)")
            undecided = [name for name in _routed_revisions(service, tag) if _condition(next(
                (r for r in revisions if r["metadata"]["name"] == name), {})).get("status") not in ("True", "False")]
            if undecided:
                await self._decided(ref.namespace, undecided[0], remaining)
                continue
            with contextlib.suppress(TimeoutError):
                await self._await_service(ref, partial(_changed, service), remaining)

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
            _preload_content=False,
            # A bounded connect; a read waits for the next line up to a day (a quiet workload).
            _request_timeout=(self.kube.settings.request_timeout_seconds, FOLLOW_READ_TIMEOUT_SECONDS)))
        try:
            while True:
                raw = await anyio.to_thread.run_sync(response.readline, abandon_on_cancel=True)
                if not raw:
                    return
                yield raw.decode(errors="replace").rstrip("\n")
        finally:
            response.close()

    async def log_history(self, ref: WorkloadRef, *, since: datetime | None = None, limit: int = 500) -> list[LogLine]:
        """The kept history (the workload's live pods collected first); without a `history_dir`, what the
        workload's pods still hold."""
        if self.history_dir is None:
            lines: list[LogLine] = []
            for pod in await self._pods_of(ref):
                lines += await self._pod_lines(ref, pod, None)
        else:
            await self.collect_logs(ref)
            lines = await asyncio.to_thread(_read_history, self._history_path(ref.key))
            cutoff = datetime.now(UTC) - self.log_retention
            lines = [line for line in lines if line.ts >= cutoff]
        unique = {(line.pod, line.ts, line.message): line for line in lines if since is None or line.ts >= since}
        ordered = sorted(unique.values(), key=lambda line: line.ts)
        return ordered[-limit:] if limit > 0 else []

    async def _pod_lines(self, ref: WorkloadRef, pod: dict[str, Any], after: datetime | None) -> list[LogLine]:
        """A pod's lines (of its `workload` container) newer than `after`."""
        meta = pod["metadata"]
        extra: dict[str, Any] = {}
        if after is not None:  # the API's `sinceSeconds` is coarse: ask a second more, keep what is newer
            extra["since_seconds"] = max(1, math.ceil((datetime.now(UTC) - after).total_seconds()) + 1)
        text = await self.kube.call(self.kube.core.read_namespaced_pod_log, meta["name"], meta["namespace"],
                                    container="workload", timestamps=True, **extra)
        revision = our_revision(ref, (meta.get("labels") or {}).get(REVISION_LABEL, ""))
        lines = []
        for raw in str(text or "").splitlines():
            stamp, _, message = raw.partition(" ")
            try:
                ts = _time(stamp)
            except ValueError:
                continue
            if after is None or ts > after:
                lines.append(LogLine(ts=ts, revision=revision, pod=meta["name"], stream="stdout", message=message))
        return lines

    async def collect_logs(self, ref: WorkloadRef | None = None) -> int:
        """Store the new lines of the workload's pods (of every workload's, cluster-wide, without `ref`);
        how many were stored."""
        if self.history_dir is None:
            return 0
        if ref is not None:
            pods = [(ref, pod) for pod in await self._pods_of(ref)]
        else:
            pods = [(found, pod) for pod in await self.kube.in_own_namespaces(self.kube.core.list_namespaced_pod,
                                                                              labels=MANAGED)
                    if (found := _ref_of_pod(pod)) is not None]
        stored = 0
        async with self._history_lock:
            for owner, pod in pods:
                known = await self._known(owner.key)
                name = pod["metadata"]["name"]
                try:
                    lines = await self._pod_lines(owner, pod, known.get(name))
                except Exception as exc:  # noqa: BLE001 - a pod that went away meanwhile; the others still count
                    log.debug("no log of pod %s: %s", name, api_message(exc))
                    continue
                if lines:
                    await asyncio.to_thread(_append_history, self._history_path(owner.key), lines)
                    known[name] = max(line.ts for line in lines)
                    stored += len(lines)
        return stored

    async def erase_log_lines(self, ref: WorkloadRef, needles: Sequence[str]) -> int:
        """The kept history's lines (live pods collected first); a live pod's own container log is the
        cluster's and stays until the pod goes."""
        wanted = [n for n in needles if n]
        if self.history_dir is None or not wanted:
            return 0
        await self.collect_logs(ref)
        return await asyncio.to_thread(erase_lines, self._history_path(ref.key),
                                       lambda message: any(n in message for n in wanted))

    def _history_path(self, key: str) -> Path:
        assert self.history_dir is not None
        return self.history_dir / f"{key}.jsonl"

    async def _known(self, key: str) -> dict[str, datetime]:
        """Per pod, the newest line of the workload already stored (read once from its file)."""
        if key not in self._stored:
            newest: dict[str, datetime] = {}
            for line in await asyncio.to_thread(_read_history, self._history_path(key)):
                newest[line.pod] = max(newest.get(line.pod, line.ts), line.ts)
            self._stored[key] = newest
        return self._stored[key]

    async def start(self) -> None:
        if self.history_dir is not None and self._collector is None:
            self._collector = asyncio.get_running_loop().create_task(self._collect_forever())

    async def _collect_forever(self) -> None:
        while True:
            try:
                await self.collect_logs()
                if time.monotonic() - self._last_compaction >= COMPACT_EVERY_SECONDS:
                    self._last_compaction = time.monotonic()
                    await asyncio.to_thread(self._compact)
            except Exception:  # noqa: BLE001 - the API server may be away for a moment; try again next time
                log.warning("collecting workload logs failed", exc_info=True)
            await asyncio.sleep(self.log_poll_seconds)

    def _compact(self) -> None:
        """Drop history lines older than the retention."""
        cutoff = datetime.now(UTC) - self.log_retention
        for path in self.history_dir.glob("*.jsonl") if self.history_dir and self.history_dir.is_dir() else []:
            lines = _read_history(path)
            kept = [line for line in lines if line.ts >= cutoff]
            if len(kept) != len(lines):
                tmp = path.with_suffix(".jsonl.tmp")
                tmp.write_text("".join(json.dumps(_line_to_json(line)) + "\n" for line in kept))
                tmp.replace(path)

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
        if self.history_dir is not None:
            async with self._history_lock:
                self._stored.pop(ref.key, None)
                self._history_path(ref.key).unlink(missing_ok=True)
        # The cluster's garbage collector removes revisions and their pods after the Service: wait (a few
        # seconds at most) so that usage read right after no longer counts them, on a watch of each.
        deadline = time.monotonic() + self.settle_seconds
        going = [(self._lister("revisions"), r["metadata"]["name"]) for r in await self._revisions(ref)]
        going += [(self.kube.core.list_namespaced_pod, p["metadata"]["name"]) for p in await self._pods_of(ref)]
        for lister, name in going:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await self.kube.wait_gone(lister, ref.namespace, name, remaining)

    async def usage(self, namespace: str) -> dict[str, int]:
        """The ResourceQuota's `status.used` (the cluster's own count). A resource the quota does not
        track (no hard: unlimited) or a namespace without a quota is counted from the objects."""
        from caiplatform.adapters.kubernetes.projects import QUOTA_NAME
        from caiplatform.quantity import parse_quantity

        core, apps = self.kube.core, self.kube.apps
        if await self.kube.get(core.read_namespace, namespace) is None:
            # No namespace, nothing in it (and no right to ask: the platform's grants are per namespace).
            return {"pods": 0, "services": 0, "count/deployments.apps": 0}
        quota = await self.kube.get(self.kube.core.read_namespaced_resource_quota, QUOTA_NAME, namespace)
        used = ((quota or {}).get("status") or {}).get("used") or {}
        usage = {r: parse_quantity(r, str(v)) for r, v in used.items()}
        for resource, method in (("pods", core.list_namespaced_pod), ("services", core.list_namespaced_service),
                                 ("count/deployments.apps", apps.list_namespaced_deployment)):
            if resource not in usage:
                usage[resource] = len((await self.kube.call(method, namespace)).get("items") or [])
        return usage

    async def close(self) -> None:
        if self._collector is not None:
            self._collector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._collector
            self._collector = None
        await self.kube.close()


MANAGED = owned()


def _ref_of_pod(pod: dict[str, Any]) -> WorkloadRef | None:
    """The workload a pod runs for, from the labels Knative copies from the revision's template."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    namespace = meta.get("namespace") or ""
    if not (labels.get(WORKLOAD_LABEL) and labels.get(PROJECT_LABEL) and labels.get(REVISION_LABEL)
            and namespace.startswith(NAMESPACE_PREFIX)):
        return None
    return WorkloadRef(labels[PROJECT_LABEL], namespace.removeprefix(NAMESPACE_PREFIX), labels[WORKLOAD_LABEL],
                       kind=labels.get(KIND_LABEL) or "agent")


def _line_to_json(line: LogLine) -> dict[str, Any]:
    return {"ts": line.ts.isoformat(), "revision": line.revision, "pod": line.pod, "stream": line.stream,
            "message": line.message}


def _append_history(path: Path, lines: list[LogLine]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(_line_to_json(line)) + "\n" for line in lines))


def _read_history(path: Path) -> list[LogLine]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            d = json.loads(raw)
            out.append(LogLine(datetime.fromisoformat(d["ts"]), d["revision"], d["pod"], d["stream"], d["message"]))
    return out
