"""`kmock`'s Kubernetes API emulator, made to answer as the adapters expect an API server to.

`kmock.KubernetesEmulator` stores objects and serves the API's verbs over HTTP on a loopback port; the
official client talks to it as to an API server. It is not an API server, and these are the differences
the tests work around here (so the adapters stay written for a real cluster):

- kmock cannot route the cluster-scoped `/api/v1/namespaces[/<name>]` (it reads the segment after
  `namespaces` as a namespace): `_parse_path` routes those paths to the `namespaces` resource.
- kmock ignores `labelSelector`: `FilteringEmulator` filters list answers by equality selectors.
- kmock deletes nothing when a namespace goes: `FilteringEmulator` removes the namespace's objects, as the
  namespace controller would.
- kmock answers POST with 200 (not 201) and keeps no `resourceVersion`, `uid` or `creationTimestamp`:
  `FilteringEmulator` stamps every object a write stores (a new `resourceVersion`, and a `uid` and
  `creationTimestamp` on create) and refuses a write that names a `resourceVersion` no longer the object's
  with `409 Conflict`, as the API server's optimistic concurrency does; what the controller double writes
  directly keeps the controllers' own `creationTimestamp`.
- kmock serves the `log` subresource as the pod itself: `FilteringEmulator` answers it from `pod_logs`
  (with `timestamps` and `tailLines`; `follow` ends with what is there).
- kmock merges every PATCH as JSON merge patch (lists replaced, `null` removes), whatever its content
  type; the adapters only send merge patches, so this matches a real server for them.
- kmock keeps a Secret's `stringData` as sent: `FilteringEmulator` folds it into base64 `data`, as the API
  server does (so reads see only `data`).
- kmock's watch streams only the changes made through its HTTP verbs, from "now", with no
  `resourceVersion`: `FilteringEmulator` answers a list with a `resourceVersion` naming a snapshot of what
  it listed, and a watch from that version with every change since (whoever made it: the controller
  double writes objects directly), until its `timeoutSeconds`; a version older than
  `oldest_watchable` is answered with a `410 Gone` event, as an API server answers a compacted one.
- kmock validates nothing: `FilteringEmulator` refuses what the API server and Knative's webhook refuse
  (`caiplatform.testing.kube_admission`: object metadata, names per kind, Knative's pod-spec fields and
  revision names, Pod Security "restricted"; `caiplatform.testing.kube_quota`: a LimitRange's defaults and
  ResourceQuota admission, with `status.used` kept), and `caiplatform.testing.kube_schemas` checks every
  object against the schemas. The controller double's own pods, Deployments, Services and claims meet
  the same quota admission (`admit_controller_write`), as a cluster's controllers create them through the
  API.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import attrs
import kmock
from kmock._internal import parsing
from kmock._internal.k8s import KubernetesError

from caiplatform.testing.kube_admission import DEFAULT_KNATIVE_FEATURES, Refused, admit, merge_patch
from caiplatform.testing.kube_quota import charge, with_defaults

RESOURCES = (
    "v1/namespaces", "v1/pods", "v1/services", "v1/secrets", "v1/resourcequotas", "v1/limitranges",
    "v1/persistentvolumeclaims", "v1/configmaps", "apps/v1/deployments", "apps/v1/statefulsets", "batch/v1/jobs",
    "networking.k8s.io/v1/networkpolicies", "serving.knative.dev/v1/services", "serving.knative.dev/v1/revisions",
    "rbac.authorization.k8s.io/v1/rolebindings", "v1/events",
)
_original_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip("/").split("?")[0].split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) <= 4:
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _original_parse_path(path)


parsing.parse_path = _parse_path  # kmock's parser of request paths, read at every request


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fields_match(obj: dict[str, Any], selector: str) -> bool:
    """Equality field selectors on a dotted path (`metadata.name`, an Event's `involvedObject.kind`: what the
    adapters send)."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, _, value = term.partition("=")
        found: Any = obj
        for part in key.split("."):
            found = found.get(part) if isinstance(found, dict) else None
        if found != value.lstrip("="):
            return False
    return True


def _matches(labels: dict[str, str], selector: str) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        key, sep, value = term.partition("=")
        if sep:
            if labels.get(key) != value.lstrip("="):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class FilteringEmulator(kmock.KubernetesEmulator):
    #: (namespace, pod) -> lines, each `<RFC 3339 time> <text>` as the kubelet keeps them
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict)
    #: The Knative feature flags the cluster's `config-features` enables (none by default, as Knative's).
    knative_features: frozenset[str] = attrs.field(default=DEFAULT_KNATIVE_FEATURES)
    #: Every write refused by admission: (status, message), for tests to read.
    refusals: list[tuple[int, str]] = attrs.field(factory=list)
    #: Lists answered (each a `resourceVersion`) and what each listed, for watches to start from.
    list_versions: dict[int, dict[tuple[str | None, str], dict[str, Any]]] = attrs.field(factory=dict)
    #: A watch from an older `resourceVersion` is refused with 410 Gone (tests raise it to force a relist).
    oldest_watchable: int = 0
    #: Writes served: each gives the object it wrote the next `resourceVersion`.
    write_count: int = 0

    def _current(self, request, selector: str) -> dict[tuple[str | None, str], dict[str, Any]]:  # type: ignore[no-untyped-def]
        found = {}
        for (res, ns, name), obj in snapshot(self):
            if res == request.resource and not obj.deleted and (request.namespace is None or ns == request.namespace) \
                    and _matches((obj.raw.get("metadata") or {}).get("labels") or {}, selector) \
                    and _fields_match(obj.raw, (request.params or {}).get("fieldSelector", "")):
                found[(ns, name)] = copy.deepcopy(obj.raw)
        return found

    async def _serve_watch(self, request):  # type: ignore[no-untyped-def]
        yield b""
        params = request.params or {}
        version = params.get("resourceVersion") or ""
        if version.isdigit() and int(version) < self.oldest_watchable:
            yield {"type": "ERROR", "object": {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": 410,
                                               "reason": "Expired", "message": f"too old resource version: {version}"}}
            return
        selector = params.get("labelSelector", "")
        seen = self.list_versions.get(int(version), {}) if version.isdigit() else {}
        timeout = float(params.get("timeoutSeconds") or 0)
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        while deadline is None or asyncio.get_running_loop().time() < deadline:
            current = self._current(request, selector)
            for key, raw in current.items():
                if key not in seen or seen[key] != raw:
                    yield {"type": "ADDED" if key not in seen else "MODIFIED", "object": raw}
            for key in [k for k in seen if k not in current]:
                yield {"type": "DELETED", "object": seen[key]}
            seen = current
            await asyncio.sleep(0.02)

    def _authorize(self, request) -> None:  # type: ignore[no-untyped-def]
        """The control plane's rights are granted per namespace it made (backends/kubernetes/base/rbac.yaml), and
        the API server checks them before it looks for anything: a call into a namespace that does not exist
        is a 403, not a 404 or an empty list."""
        resource, namespace = request.resource, request.namespace
        if resource is None or resource.plural in (None, "namespaces") or not namespace:
            return
        for (res, _ns, name), candidate in snapshot(self):
            if res.plural == "namespaces" and name == namespace and not candidate.deleted:
                return
        verb = str(getattr(request.action, "value", request.action)).lower()
        raise KubernetesError(status=403, reason="Forbidden", details={}, message=(
            f'{resource.plural} is forbidden: User "system:serviceaccount:caiplatform:caiplatform" cannot {verb} '
            f'resource "{resource.plural}" in API group "{resource.group or ""}" in the namespace "{namespace}"'))

    def _stamp(self, request, response) -> None:  # type: ignore[no-untyped-def]
        """What the API server sets on every write: a new `resourceVersion` (and a `uid` and
        `creationTimestamp` on create), so a later write naming an older version is refused with 409."""
        resource = request.resource
        if resource is None or response.status >= 300 or request.action not in (kmock.action.CREATE, kmock.action.UPDATE):
            return
        name = request.name or ((request.data or {}).get("metadata") or {}).get("name") if isinstance(request.data, dict) else request.name
        namespace = request.namespace or ((request.data or {}).get("metadata") or {}).get("namespace") \
            if isinstance(request.data, dict) else request.namespace
        for (res, ns, stored_name), obj in snapshot(self):
            if res == resource and ns == namespace and stored_name == name and not obj.deleted:
                self.write_count += 1
                meta = obj.raw.get("metadata") or {}
                stamp: dict[str, Any] = {"resourceVersion": str(self.write_count)}
                if request.action == kmock.action.CREATE:
                    stamp.setdefault("uid", meta.get("uid") or str(uuid.uuid4()))
                    stamp.setdefault("creationTimestamp", meta.get("creationTimestamp") or now())
                obj.patch({"metadata": stamp})

    def _admit(self, request) -> None:  # type: ignore[no-untyped-def]
        resource = request.resource
        if resource is None or resource.plural is None or not isinstance(request.data, dict):
            return
        plural, group = resource.plural, resource.group or ""
        if request.subresource:  # status and other subresources are the controllers' writes
            return
        old = None
        if request.action == kmock.action.CREATE:
            obj = request.data
            namespace = request.namespace or (obj.get("metadata") or {}).get("namespace")
        elif request.action == kmock.action.UPDATE and request.name:
            stored = None
            for (res, ns, name), candidate in snapshot(self):
                if res == resource and ns == request.namespace and name == request.name and not candidate.deleted:
                    stored = candidate
            if stored is None:
                return  # kmock answers 404
            old = dict(stored.raw)
            given = (request.data.get("metadata") or {}).get("resourceVersion")
            held = (old.get("metadata") or {}).get("resourceVersion")
            if given is not None and given != held:
                # Optimistic concurrency: a write naming a resourceVersion that is no longer the object's.
                self.refusals.append((409, "stale resourceVersion"))
                raise KubernetesError(status=409, reason="Conflict", details={}, message=(
                    f'Operation cannot be fulfilled on {plural} "{request.name}": the object has been modified; '
                    "please apply your changes to the latest version and try again"))
            obj = merge_patch(old, request.data)
            obj.setdefault("kind", old.get("kind"))
            namespace = request.namespace
        else:
            return
        if request.action == kmock.action.CREATE and plural == "pods" and group == "" and namespace:
            # LimitRanger is a mutating plugin: it runs before the validating ones (Pod Security, quota),
            # and the pod is stored with what it filled in.
            defaulted = with_defaults(obj, [o.raw for o in self._in_namespace("limitranges", "", namespace)])
            obj.clear()
            obj.update(defaulted)
        labels: dict[str, str] = {}
        if plural == "pods" and namespace:
            for (res, _ns, name), candidate in snapshot(self):
                if res.plural == "namespaces" and name == namespace and not candidate.deleted:
                    labels = (candidate.raw.get("metadata") or {}).get("labels") or {}
        try:
            admit(plural, group, obj, old, namespace_labels=labels, knative_features=self.knative_features)
            if request.action == kmock.action.CREATE and namespace:
                self._charge(plural, group, namespace, obj)
        except Refused as exc:
            self.refusals.append((exc.status, exc.message))
            raise KubernetesError(status=exc.status, reason=exc.reason, message=exc.message, details={}) from None

    def _in_namespace(self, plural: str, group: str, namespace: str) -> list[Any]:
        return [obj for ns, _, obj in live(self, plural, group) if ns == namespace]

    def _charge(self, plural: str, group: str, namespace: str, obj: dict[str, Any]) -> None:
        """ResourceQuota admission (`kube_quota.charge`): refuse, or count `obj` in its quotas' `status.used`
        before it is stored, as the plugin does."""
        for name, used in charge(plural, group, obj, [o.raw for o in self._in_namespace("resourcequotas", "", namespace)]).items():
            for quota in self._in_namespace("resourcequotas", "", namespace):
                if quota.raw["metadata"]["name"] == name:
                    quota.patch({"status": {"used": used}})

    def admit_controller_write(self, plural: str, group: str, namespace: str, obj: dict[str, Any]) -> str | None:
        """What a controller's create of `obj` meets at quota admission (the controller double writes
        objects directly, but a cluster's controllers create pods, Deployments, Services and claims through
        the API): None when admitted (and counted), else the API server's message, also kept in
        `refusals`. A pod gets its LimitRange defaults in place."""
        if plural == "pods" and group == "":
            defaulted = with_defaults(obj, [o.raw for o in self._in_namespace("limitranges", "", namespace)])
            obj.clear()
            obj.update(defaulted)
        try:
            self._charge(plural, group, namespace, obj)
        except Refused as exc:
            if not self.refusals or self.refusals[-1] != (exc.status, exc.message):  # controllers retry each pass
                self.refusals.append((exc.status, exc.message))
            return exc.message
        return None

    async def _serve_list(self, request):  # type: ignore[no-untyped-def]
        body = await super()._serve_list(request)
        params = request.params or {}
        selector = params.get("labelSelector", "")
        body["items"] = [o for o in body["items"] if _matches((o.get("metadata") or {}).get("labels") or {}, selector)
                         and _fields_match(o, params.get("fieldSelector", ""))]
        version = len(self.list_versions) + 1
        self.list_versions[version] = {((o.get("metadata") or {}).get("namespace"), o["metadata"]["name"]): copy.deepcopy(o)
                                       for o in body["items"]}
        body["metadata"] = {"resourceVersion": str(version)}
        return body

    async def _serve_fetch(self, request):  # type: ignore[no-untyped-def]
        if request.subresource == "log":
            await super()._serve_fetch(request)  # 404 for a pod that is not there
            params = request.params or {}
            lines = self.pod_logs.get((request.namespace, request.name), "").splitlines()
            if params.get("timestamps") != "true":
                lines = [line.partition(" ")[2] for line in lines]
            if params.get("tailLines"):
                lines = lines[-int(params["tailLines"]):] if int(params["tailLines"]) else []
            return "".join(line + "\n" for line in lines).encode()
        return await super()._serve_fetch(request)

    async def _handle(self, request):  # type: ignore[no-untyped-def]
        self._authorize(request)
        self._admit(request)
        response = await super()._handle(request)
        self._stamp(request, response)
        resource = request.resource
        if resource is not None and resource.plural == "secrets" and response.status < 300:
            for _, _, obj in live(self, "secrets"):
                if obj.raw.get("stringData"):
                    folded = {k: base64.b64encode(v.encode()).decode() for k, v in obj.raw["stringData"].items()}
                    obj.patch({"stringData": None, "data": folded})
        if (request.action == kmock.action.DELETE and resource is not None and resource.plural == "namespaces"
                and request.name and response.status < 300):
            for (_, namespace, _), obj in snapshot(self):
                if namespace == request.name and not obj.deleted:
                    obj.delete()
        return response


def snapshot(emulator: kmock.KubernetesEmulator) -> list[tuple[Any, Any]]:
    """The stored objects now. The emulator's loop may add one while a test's thread reads: read again."""
    while True:
        try:
            return list(emulator.objects.items())
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


def live(emulator: kmock.KubernetesEmulator, plural: str, group: str = "") -> list[tuple[str | None, str, Any]]:
    return [(ns, name, obj) for (res, ns, name), obj in snapshot(emulator)
            if res.plural == plural and res.group == group and not obj.deleted]


@dataclass
class ApiCall:
    verb: str
    group: str
    resource: str  # plural, with `/subresource` when there is one
    namespace: str | None


def recorded_calls(emulator: kmock.KubernetesEmulator) -> list[ApiCall]:
    """Every API call the emulator served, as RBAC names them (verb, API group, resource)."""
    calls = []
    for request in list(emulator):
        resource = request.resource
        if resource is None or resource.plural is None:
            continue  # discovery (/api, /apis, /version) needs no rule
        method = str(request.method.value if hasattr(request.method, "value") else request.method).upper()
        params = request.params or {}
        if method == "GET":
            verb = "watch" if params.get("watch") == "true" else "get" if request.name else "list"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method) or (
                "delete" if request.name else "deletecollection")
        plural = resource.plural + (f"/{request.subresource}" if request.subresource else "")
        calls.append(ApiCall(verb, resource.group or "", plural, request.namespace))
    return calls
