"""What a cluster's controllers and Knative's request path would do, for the emulator
(`caiplatform.testing.kube_emulator`).

`ControllerDouble` stands in for Knative Serving (a Revision per template, its
readiness from its container, status traffic, URLs, scale: `min-scale` pods while routed, zero
otherwise, plus the Deployment and two Services Knative makes per revision), the Job controller (a build
Job succeeds, or fails when its source says so), the StatefulSet controller (its claims and pod, ready
after a moment, again after a restart), the garbage collector (what a Knative Service or a StatefulSet
owns goes with it) and the ResourceQuota controller (`status.used` recounted from what is stored: pods
with their requests and limits, services, claims, deployments). What these controllers create through a
cluster's API (a revision's Deployment, Services and pods, a StatefulSet's claims and pod) meets quota
admission first: a refused pod makes its revision not ready with the API server's message; a refused
claim or pod of a StatefulSet is a `FailedCreate` event on it, in the controller's words. `DataPlane` stands in
for Knative's request path with in-process tiny apps; nothing else runs, so logs of a live process and
autoscaling are not emulated.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Callable
from typing import Any

import httpx

from caiplatform.quantity import format_quantity
from caiplatform.testing.kube_emulator import FilteringEmulator, live, now
from caiplatform.testing.kube_quota import COUNTED, total_usage


class ControllerDouble:
    """What the cluster's controllers would write, one pass every `period` seconds (see the module doc)."""

    def __init__(self, emulator: FilteringEmulator, period: float = 0.02):
        self.k = emulator
        self.period = period
        self.build_outcome: Callable[[dict[str, Any]], tuple[bool, str]] = lambda job: (True, "")
        #: Knative Services and Revisions (by name) the double leaves as they are, as a busy controller
        #: would: a paused Service's status is not updated, a paused Revision stays undecided (`Unknown`).
        self.paused: set[str] = set()

    async def run(self) -> None:
        while True:
            for step in (self._knative, self._jobs, self._statefulsets, self._quota):
                step()
            await asyncio.sleep(self.period)

    # -- helpers ------------------------------------------------------------------------------------
    def _put(self, resource: str, namespace: str | None, name: str, body: dict[str, Any]) -> None:
        self.k.objects[resource, namespace, name] = body

    def _create(self, resource: str, namespace: str, name: str, body: dict[str, Any]) -> str | None:
        """Create what a controller creates through the API: quota admission first (None when admitted,
        else the API server's refusal, and nothing is created)."""
        group, _, plural = resource.rpartition("/")
        refused = self.k.admit_controller_write(plural, group.rpartition("/")[0], namespace, body)
        if refused is None:
            self._put(resource, namespace, name, body)
        return refused

    def _patch(self, obj: Any, changes: dict[str, Any]) -> None:
        merged = dict(obj.raw)
        if any(merged.get(k) != v for k, v in changes.items()):
            obj.patch(changes)

    def _reap(self, plural: str, group: str, namespace: str | None, label: str, value: str) -> None:
        for ns, _, obj in live(self.k, plural, group):
            if ns == namespace and (obj.raw.get("metadata", {}).get("labels") or {}).get(label) == value:
                obj.delete()

    # -- Knative Serving ----------------------------------------------------------------------------
    def _knative(self) -> None:
        services = {(ns, name): obj for ns, name, obj in live(self.k, "services", "serving.knative.dev")}
        revisions = live(self.k, "revisions", "serving.knative.dev")
        for ns, name, obj in revisions:  # the garbage collector: a revision goes with its service
            if (ns, obj.raw["metadata"]["labels"]["serving.knative.dev/service"]) not in services:
                meta = obj.raw["metadata"]
                if meta.get("finalizers"):
                    # The collector deletes through the API, which keeps an object with finalizers, marked,
                    # until they are removed (apiserver's graceful deletion; kubernetes'
                    # staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go, deletionFinalizersForGarbageCollection).
                    if not meta.get("deletionTimestamp"):
                        obj.patch({"metadata": {"deletionTimestamp": now()}})
                    continue
                obj.delete()
                for plural, group in (("deployments", "apps"), ("services", ""), ("pods", "")):
                    self._reap(plural, group, ns, "serving.knative.dev/revision", name)
        for (ns, name), service in services.items():
            self._reconcile_service(ns or "", name, service)

    def _reconcile_service(self, ns: str, name: str, service: Any) -> None:
        if name in self.paused:
            return
        body = service.raw
        template = body["spec"]["template"]
        revision_name = template["metadata"]["name"]
        existing = {n: o for rns, n, o in live(self.k, "revisions", "serving.knative.dev") if rns == ns
                    and o.raw["metadata"]["labels"]["serving.knative.dev/service"] == name}
        if revision_name not in existing:
            labels = {**(template["metadata"].get("labels") or {}), "serving.knative.dev/service": name,
                      "serving.knative.dev/configuration": name, "serving.knative.dev/revision": revision_name}
            self._put("serving.knative.dev/v1/revisions", ns, revision_name, {
                "apiVersion": "serving.knative.dev/v1", "kind": "Revision",
                "metadata": {"name": revision_name, "namespace": ns, "labels": labels, "creationTimestamp": now(),
                             "annotations": dict(template["metadata"].get("annotations") or {})},
                "spec": template["spec"], "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
            return  # readiness on a later pass, as the real controller takes a moment
        for rev_name, revision in existing.items():
            if revision.raw["status"]["conditions"][0]["status"] == "Unknown" and rev_name not in self.paused:
                self._patch(revision, {"status": self._revision_outcome(ns, revision.raw)})
        ready = sorted((o.raw["metadata"]["creationTimestamp"], n) for n, o in existing.items()
                       if o.raw["status"]["conditions"][0]["status"] == "True")
        latest_ready = ready[-1][1] if ready else None
        host = f"{name}.{ns}.svc.cluster.local"
        traffic = []
        for entry in body["spec"].get("traffic") or [{"latestRevision": True, "percent": 100}]:
            target = latest_ready if entry.get("latestRevision") else entry.get("revisionName")
            resolved = {"percent": entry.get("percent", 0), "latestRevision": bool(entry.get("latestRevision"))}
            if target:
                resolved["revisionName"] = target
            if entry.get("tag"):
                resolved["tag"] = entry["tag"]
                resolved["url"] = f"http://{entry['tag']}-{host}"
            traffic.append(resolved)
        created = existing[revision_name].raw["status"]["conditions"][0]
        # A condition keeps its transition time while its status stays (knative.dev/pkg `apis/condition_set.go`
        # `SetCondition`): the Service's status changes only when something in it does.
        previous = ((body.get("status") or {}).get("conditions") or [{}])[0]
        ready_condition = {"type": "Ready", "status": created["status"],
                           "lastTransitionTime": previous.get("lastTransitionTime") if previous.get("status") == created["status"]
                           else now()}
        if created["status"] == "False":
            ready_condition |= {"reason": "RevisionFailed",
                                "message": f'Revision "{revision_name}" failed with message: {created["message"]}.'}
        self._patch(service, {"status": {
            "observedGeneration": 1, "url": f"http://{host}", "address": {"url": f"http://{host}"},
            "latestCreatedRevisionName": revision_name, "latestReadyRevisionName": latest_ready,
            "traffic": traffic, "conditions": [ready_condition]}})
        routed = {t.get("revisionName") for t in traffic if t["percent"] > 0 or t.get("tag")}
        for rev_name, revision in existing.items():
            annotations = revision.raw["metadata"].get("annotations") or {}
            ok = revision.raw["status"]["conditions"][0]["status"] == "True"
            scale = int(annotations.get("autoscaling.knative.dev/min-scale", "0")) if ok and rev_name in routed else 0
            self._run_revision(ns, rev_name, revision, scale)

    def _revision_outcome(self, ns: str, revision: dict[str, Any]) -> dict[str, Any]:
        """The kubelet's verdict on the revision's container: a missing Secret key or an image that is
        built to fail (the tiny test app's `TINY_FAIL_START`) makes it fail."""
        container = revision["spec"]["containers"][0]
        for env in container.get("env") or []:
            ref = (env.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                found = [o for sns, n, o in live(self.k, "secrets") if sns == ns and n == ref["name"]]
                if not found or ref["key"] not in (found[0].raw.get("data") or {}):
                    return {"actualReplicas": 0, "conditions": [{"type": "Ready", "status": "False",
                            "reason": "CreateContainerConfigError", "message": f'secret "{ref["name"]}" not found'}]}
            if env.get("name") == "TINY_UNHEALTHY" and env.get("value") == "1":
                return {"actualReplicas": 0, "conditions": [{"type": "Ready", "status": "False",
                        "reason": "ProgressDeadlineExceeded", "message": "Initial scale was never achieved"}]}
            if env.get("name") == "TINY_FAIL_START" and env.get("value") == "1":
                return {"actualReplicas": 0, "conditions": [{"type": "Ready", "status": "False", "reason": "ExitCode1",
                        "message": "Container failed with: tiny app refused to start"}]}
        return {"actualReplicas": 0, "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now()}]}

    def _run_revision(self, ns: str, name: str, revision: Any, replicas: int) -> None:
        labels = {"serving.knative.dev/revision": name,
                  "serving.knative.dev/service": revision.raw["metadata"]["labels"]["serving.knative.dev/service"]}
        refused = None
        if not [1 for dns, n, _ in live(self.k, "deployments", "apps") if dns == ns and n == f"{name}-deployment"]:
            refused = self._create("apps/v1/deployments", ns, f"{name}-deployment", {"metadata": {
                "name": f"{name}-deployment", "namespace": ns, "labels": labels}, "spec": {"replicas": replicas}})
            for service in (name, f"{name}-private"):
                if refused is None and not [1 for sns, n, _ in live(self.k, "services") if sns == ns and n == service]:
                    refused = self._create("v1/services", ns, service, {"metadata": {"name": service, "namespace": ns,
                                                                                      "labels": labels}})
        pods = sorted(n for pns, n, o in live(self.k, "pods") if pns == ns
                      and (o.raw["metadata"].get("labels") or {}).get("serving.knative.dev/revision") == name)
        for index in range(len(pods), replicas if refused is None else 0):
            pod = f"{name}-deployment-{index:05d}"
            # Knative gives a revision's pods the revision's labels (the template's, then its own), and its
            # container's resources.
            pod_labels = {**(revision.raw["metadata"].get("labels") or {}), **labels}
            containers = [{"name": c.get("name") or "user-container", "image": c.get("image"),
                           "resources": dict(c.get("resources") or {})} for c in revision.raw["spec"]["containers"]]
            refused = self._create("v1/pods", ns, pod, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": pod, "namespace": ns, "labels": pod_labels, "creationTimestamp": now()},
                "spec": {"containers": containers}, "status": {"phase": "Running"}})
            if refused is not None:
                break
        for pod in pods[replicas:]:
            self.k.objects["v1/pods", ns, pod].delete()
        status = {**revision.raw["status"], "actualReplicas": min(replicas, len(pods)) if refused else replicas}
        if refused is not None:
            # The ReplicaSet's `ReplicaFailure` (reason FailedCreate, the API server's message), which Knative
            # makes the revision's (knative/serving `pkg/apis/serving/k8s_lifecycle.go`
            # `TransformDeploymentStatus`, `PropagateDeploymentStatus`): the revision is not ready. A refused
            # Deployment or Service is shown the same way here (Knative reports those as events and retries).
            status["conditions"] = [{"type": "Ready", "status": "False", "reason": "FailedCreate", "message": refused}]
        self._patch(revision, {"status": status})

    # -- Jobs, StatefulSets, quota ------------------------------------------------------------------
    def _jobs(self) -> None:
        """A Job's pod runs to its end at once: it succeeds (an image builder's digest, derived from the
        Job's source label, in the termination message) unless `build_outcome` says otherwise."""
        for ns, name, job in live(self.k, "jobs", "batch"):
            if job.raw.get("status"):
                continue
            succeeded, message = self.build_outcome(job.raw)
            source = (job.raw["metadata"].get("labels") or {}).get("caiplatform.dev/source-digest", name)
            digest = "sha256:" + hashlib.sha256(source.encode()).hexdigest()
            pod = f"{name}-{hashlib.sha256(name.encode()).hexdigest()[:5]}"
            terminated = {"exitCode": 0 if succeeded else 1, "message": digest if succeeded else message}
            self._put("v1/pods", ns, pod, {"metadata": {"name": pod, "namespace": ns, "creationTimestamp": now(),
                      "labels": {"job-name": name}}, "status": {"phase": "Succeeded" if succeeded else "Failed",
                      "containerStatuses": [{"name": "build", "state": {"terminated": terminated}}]}})
            stamp = now()
            text = (f"INFO Unpacking the build context\nINFO Pushing image to its registry\nINFO Pushed {digest}"
                    if succeeded else message)
            self.k.pod_logs[(ns or "", pod)] = "".join(f"{stamp} {line}\n" for line in text.splitlines())
            condition = {"type": "Complete" if succeeded else "Failed", "status": "True", "message": message}
            self._patch(job, {"status": {"succeeded" if succeeded else "failed": 1, "conditions": [condition]}})
        for ns, _, pod in live(self.k, "pods"):  # the garbage collector: a Job's pods go with it
            owner = (pod.raw["metadata"].get("labels") or {}).get("job-name")
            if owner and not [1 for jns, n, _ in live(self.k, "jobs", "batch") if jns == ns and n == owner]:
                pod.delete()

    def _statefulsets(self) -> None:
        """One replica each: the claims of its templates, then pod `<name>-0`, created through the API (quota
        admission first). A refused create is recorded as the StatefulSet controller records it, a
        `FailedCreate` Warning event on the StatefulSet with its wording (kubernetes
        `pkg/controller/statefulset/stateful_pod_control.go` `recordClaimEvent`, `recordPodEvent`: `create
        Claim <claim> for Pod <pod> in StatefulSet <set> failed error: <err>`, `create Pod <pod> in StatefulSet
        <set> failed error: <err>`), and tried again next pass; a created pod gets `SuccessfulCreate`. No pod
        is made while a claim is missing. Ready after a moment, again after a restart."""
        sets = live(self.k, "statefulsets", "apps")
        for ns, _, pod in live(self.k, "pods"):  # the garbage collector: a StatefulSet's pod goes with it
            owner = next((o["name"] for o in pod.raw["metadata"].get("ownerReferences") or [] if o.get("kind") == "StatefulSet"), None)
            if owner and not [1 for sns, n, _ in sets if sns == ns and n == owner]:
                pod.delete()
        for ns, name, obj in sets:
            pod_name = f"{name}-0"
            refused = None
            for claim in obj.raw["spec"].get("volumeClaimTemplates") or []:  # one replica: ordinal 0
                claim_name = f"{claim['metadata']['name']}-{pod_name}"
                if not [1 for cns, n, _ in live(self.k, "persistentvolumeclaims") if cns == ns and n == claim_name]:
                    failed = self._create("v1/persistentvolumeclaims", ns or "", claim_name, {
                        "metadata": {"name": claim_name, "namespace": ns, "labels": claim["metadata"].get("labels") or {}},
                        "spec": claim["spec"], "status": {"phase": "Bound"}})
                    if failed is not None:
                        refused = refused or f"create Claim {claim_name} for Pod {pod_name} in StatefulSet {name} failed error: {failed}"
            if refused is None and not [1 for pns, n, _ in live(self.k, "pods") if pns == ns and n == pod_name]:
                template = obj.raw["spec"]["template"]
                failed = self._create("v1/pods", ns or "", pod_name, {"apiVersion": "v1", "kind": "Pod", "metadata": {
                    "name": pod_name, "namespace": ns, "labels": dict(template["metadata"].get("labels") or {}),
                    "creationTimestamp": now(), "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                                                                      "name": name, "uid": obj.raw["metadata"].get("uid", "")}]},
                    "spec": template["spec"], "status": {"phase": "Running"}})
                if failed is not None:
                    refused = f"create Pod {pod_name} in StatefulSet {name} failed error: {failed}"
                else:
                    self._event(obj.raw, "Normal", "SuccessfulCreate", f"create Pod {pod_name} in StatefulSet {name} successful")
            if refused is not None:  # no pod: nothing runs
                self._event(obj.raw, "Warning", "FailedCreate", refused)
                self._patch(obj, {"status": {"replicas": 0, "readyReplicas": 0}})
                continue
            restarted = (obj.raw["spec"]["template"]["metadata"].get("annotations") or {}).get(
                "kubectl.kubernetes.io/restartedAt", "")
            status = obj.raw.get("status") or {}
            if status.get("observedRestart") != restarted:
                self._patch(obj, {"status": {"replicas": 1, "readyReplicas": 0, "observedRestart": restarted}})
            elif status.get("readyReplicas") != 1:
                self._patch(obj, {"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1,
                                             "observedRestart": restarted}})

    def _event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved`, as client-go's recorder writes one (`<name>.<hex nanoseconds>`).
        The recorder counts a repeat of the newest event in place: the double keeps it as it is."""
        meta = involved["metadata"]
        ns = meta.get("namespace") or ""
        mine = sorted(((o.raw.get("lastTimestamp") or "", o.raw) for ens, _, o in live(self.k, "events") if ens == ns
                       and (o.raw.get("involvedObject") or {}).get("name") == meta["name"]), key=lambda e: e[0])
        if mine and (mine[-1][1].get("reason"), mine[-1][1].get("message")) == (reason, message):
            return
        stamp = now()
        name = f"{meta['name']}.{time.time_ns():x}"
        self._put("v1/events", ns, name, {
            "apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": ns, "creationTimestamp": stamp},
            "involvedObject": {"apiVersion": involved.get("apiVersion", "apps/v1"), "kind": involved.get("kind", "StatefulSet"),
                               "name": meta["name"], "namespace": ns, "uid": meta.get("uid", "")},
            "reason": reason, "message": message, "type": kind, "count": 1, "firstTimestamp": stamp,
            "lastTimestamp": stamp, "source": {"component": "statefulset-controller"}})

    def _quota(self) -> None:
        """The quota controller: `status.hard` from the spec, `status.used` recounted from what is stored
        (`kube_quota.total_usage`: pods with their requests and limits, services, claims, Deployments)."""
        counted = [(plural, group) for plural, group in COUNTED if (plural, group) != ("secrets", "")]
        for ns, _, quota in live(self.k, "resourcequotas"):
            used = total_usage((plural, group, o.raw) for plural, group in counted
                               for ons, _, o in live(self.k, plural, group) if ons == ns)
            hard = quota.raw.get("spec", {}).get("hard") or {}
            status = {"hard": dict(hard), "used": {r: format_quantity(r, used.get(r, 0)) for r in hard}}
            if quota.raw.get("status") != status:
                quota.patch({"status": None})
                quota.patch({"status": status})


class DataPlane(httpx.AsyncBaseTransport):
    """Knative's data plane, as far as the runtime suite needs it: a request to a Service's (or a traffic
    tag's) cluster address reaches an in-process instance of the tiny test app
    (`caiplatform.testing.tiny_app`) for the revision the Service's `status.traffic` picks (by weight,
    smooth round robin, as the in-process runtimes split), with the revision's container env, its
    `secretKeyRef`s read from the Secrets in the emulator, and `PORT`/`K_REVISION` as Knative sets them.
    No scaling: one instance per revision (hand it to the runtime as its `transport`)."""

    def __init__(self, emulator: FilteringEmulator):
        self.k = emulator
        self.apps: dict[tuple[str, str], httpx.ASGITransport] = {}
        self.credit: dict[tuple[str, str, str], float] = {}

    def _object(self, plural: str, group: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = [o.raw for ns, n, o in live(self.k, plural, group) if ns == namespace and n == name]
        return found[0] if found else None

    def _pick(self, namespace: str, host: str) -> str | None:
        for ns, name, service in live(self.k, "services", "serving.knative.dev"):
            if ns != namespace:
                continue
            traffic = (service.raw.get("status") or {}).get("traffic") or []
            tagged = [t for t in traffic if t.get("url", "").split("://")[-1] == host]
            if tagged:
                return str(tagged[0].get("revisionName") or "") or None
            if host.split(".")[0] != name:
                continue
            weights = [(t["revisionName"], int(t.get("percent") or 0)) for t in traffic
                       if t.get("revisionName") and int(t.get("percent") or 0) > 0]
            if not weights:
                return None
            for revision, weight in weights:  # smooth weighted round robin
                self.credit[(ns or "", name, revision)] = self.credit.get((ns or "", name, revision), 0) + weight
            chosen = max(weights, key=lambda w: self.credit[(ns or "", name, w[0])])[0]
            self.credit[(ns or "", name, chosen)] -= sum(w for _, w in weights)
            return str(chosen)
        return None

    def _instance(self, namespace: str, revision_name: str) -> httpx.ASGITransport | None:
        from caiplatform.testing import tiny_app

        if (namespace, revision_name) not in self.apps:
            revision = self._object("revisions", "serving.knative.dev", namespace, revision_name)
            if revision is None:
                return None
            container = revision["spec"]["containers"][0]
            env = {"PORT": str(container["ports"][0]["containerPort"]), "K_REVISION": revision_name}
            for entry in container.get("env") or []:
                ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
                if ref:
                    secret = self._object("secrets", "", namespace, ref["name"]) or {}
                    env[entry["name"]] = base64.b64decode((secret.get("data") or {})[ref["key"]]).decode()
                else:
                    env[entry["name"]] = entry.get("value", "")
            self.apps[(namespace, revision_name)] = httpx.ASGITransport(app=tiny_app.create_app(env))
        return self.apps[(namespace, revision_name)]

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        parts = host.split(".")
        namespace = parts[1] if len(parts) > 2 and parts[2] == "svc" else ""
        revision = self._pick(namespace, host)
        instance = self._instance(namespace, revision) if revision else None
        if instance is None:
            return httpx.Response(503, text=f"no ready revision serves {host}")
        return await instance.handle_async_request(request)
