"""One connection to the API server, shared by the Kubernetes adapters.

The official client is synchronous: every call goes through `KubeClient.call`, which runs it in a worker
thread so the event loop never blocks. Objects travel as plain JSON mappings (camelCase, as on the
wire): requests are sent with `_preload_content=False` and the body is decoded here, so the adapters
read exactly what the server answered and write exactly what the manifests say.
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import urllib3

from kubernetes import client, config, watch

#: Every object an adapter creates carries these labels (and `PART_LABEL` naming what it is for).
MANAGED_BY = {"app.kubernetes.io/managed-by": "caiplatform"}
PROJECT_LABEL = "caiplatform.dev/project"
WORKLOAD_LABEL = "caiplatform.dev/workload"
KIND_LABEL = "caiplatform.dev/kind"
PART_LABEL = "caiplatform.dev/part"
MERGE_PATCH = "application/merge-patch+json"

KNATIVE_GROUP, KNATIVE_VERSION = "serving.knative.dev", "v1"
#: A watch asks the API server to end it after this long (then the object is listed again): bounded waits,
#: and a stream no load balancer in between cuts silently.
WATCH_WINDOW_SECONDS = 60
#: The ClusterRole holding what the control plane does inside a namespace of its own (backends/kubernetes/
#: rbac.yaml). It is bound cluster-wide to nobody: the platform binds it in each namespace it makes.
PROJECT_ROLE = "caiplatform-project"
RBAC_GROUP = "rbac.authorization.k8s.io"


def selector(labels: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


def owned(labels: dict[str, str] | None = None) -> dict[str, str]:
    return {**MANAGED_BY, **(labels or {})}


def not_found(exc: BaseException) -> bool:
    return isinstance(exc, client.ApiException) and exc.status == 404


def conflict(exc: BaseException) -> bool:
    return isinstance(exc, client.ApiException) and exc.status == 409


def api_message(exc: BaseException) -> str:
    """The API server's own message of a refused call (its `Status.message`), else the exception text."""
    if isinstance(exc, client.ApiException) and exc.body:
        try:
            return str(json.loads(exc.body).get("message") or exc.reason)
        except (ValueError, AttributeError):
            return str(exc.reason)
    return str(exc) or type(exc).__name__


class ClusterRefused(RuntimeError):
    """A call the API server refused, said in its own words (`api_message`: its `Status.message`)."""


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster is and what the adapters run on it (from `caiplatform.settings.Settings`)."""

    kubeconfig: str | None = None  # a kubeconfig path; None: in-cluster config, then ~/.kube/config
    host: str | None = None  # an API server address without credentials (tests, `kubectl proxy`)
    context: str | None = None
    platform_namespace: str = "caiplatform"
    build_namespace: str = "caiplatform"  # build Jobs share the build-context volume with the control plane
    harness_image: str = "ghcr.io/caiplatform/harness:latest"
    builder_image: str = "docker.io/moby/buildkit:v0.25.2-rootless"
    valkey_image: str = "docker.io/valkey/valkey:8.1"
    build_push_secret: str | None = None  # a dockerconfigjson Secret in the build namespace, for BuildKit's push
    build_insecure_registry: bool = False  # plain HTTP, or a certificate BuildKit cannot check
    # Every API call gives up after this long (connect, then each read): an API server that accepts and never
    # answers must not hang a deploy forever. A watch or a followed log waits its own server-side timeout.
    request_timeout_seconds: float = 30.0
    service_account: str = "caiplatform"  # the control plane's ServiceAccount, in `platform_namespace`
    # Knative feature flags enabled in the cluster's `config-features` (Knative enables none of the
    # pod-spec ones by default; its webhook refuses a field whose flag is off).
    knative_features: frozenset[str] = frozenset()
    # The OTLP/HTTP base URL workload pods send their spans to while tracing is on (`CAI_KUBE_OTEL_ENDPOINT`).
    otel_endpoint: str = ""


def cluster_settings(settings: Any) -> ClusterSettings:
    """The cluster part of `caiplatform.settings.Settings`."""
    return ClusterSettings(kubeconfig=settings.kubeconfig, host=settings.kube_api_url, context=settings.kube_context,
                           platform_namespace=settings.platform_namespace, build_namespace=settings.build_namespace,
                           harness_image=settings.harness_image, builder_image=settings.builder_image,
                           valkey_image=settings.valkey_image, build_push_secret=settings.build_push_secret,
                           build_insecure_registry=settings.build_insecure_registry,
                           knative_features=frozenset(f.strip() for f in (settings.knative_features or "").split(",")
                                                      if f.strip()),
                           otel_endpoint=getattr(settings, "kube_otel_endpoint", "") or "")


class KubeClient:
    def __init__(self, settings: ClusterSettings | None = None, *, api_client: client.ApiClient | None = None):
        self.settings = settings or ClusterSettings()
        self.api = api_client or _api_client(self.settings)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.networking = client.NetworkingV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one API call in a worker thread, bounded by `request_timeout_seconds` (a watch or a followed
        log by its server-side `timeout_seconds` and that bound again); the decoded JSON body (or the text
        of a log)."""
        limit = self.settings.request_timeout_seconds
        if kwargs.get("watch") or kwargs.get("follow"):
            kwargs.setdefault("_request_timeout", (limit, float(kwargs.get("timeout_seconds") or 300) + limit))
        else:
            kwargs.setdefault("_request_timeout", (limit, limit))
        return await anyio.to_thread.run_sync(lambda: _decode(method(*args, _preload_content=False, **kwargs)))

    async def get(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A read that answers None for an object that does not exist (or whose namespace does not)."""
        try:
            result: dict[str, Any] = await self.call(method, *args, **kwargs)
        except client.ApiException as exc:
            if not_found(exc) or await self._namespace_gone(exc, method, args, kwargs):
                return None
            raise
        return result

    async def items(self, method: Callable[..., Any], *args: Any, labels: dict[str, str], **kwargs: Any) -> list[dict[str, Any]]:
        """Objects of a list call carrying every one of `labels` (none in a namespace that does not exist)."""
        try:
            body = await self.call(method, *args, label_selector=selector(labels), **kwargs)
        except client.ApiException as exc:
            if await self._namespace_gone(exc, method, args, kwargs):
                return []
            raise
        return list(body.get("items") or [])

    async def _namespace_gone(self, exc: client.ApiException, method: Callable[..., Any], args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> bool:
        """Whether a 403 is the API server's answer about a namespace that does not exist: the platform's rights
        are granted per namespace it made (RBAC is checked before existence), so a read in a namespace that is
        not there (yet, or any more) is forbidden rather than empty."""
        if exc.status != 403:
            return False
        try:
            namespace = inspect.signature(method).bind_partial(*args, **kwargs).arguments.get("namespace")
        except (TypeError, ValueError):
            return False
        if not isinstance(namespace, str):
            return False
        try:
            await self.call(self.core.read_namespace, namespace)
        except client.ApiException as missing:
            return not_found(missing)
        return False

    async def wait_for(self, list_method: Callable[..., Any], namespace: str, name: str,
                       done: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The object `name` once `done(object)` holds: listed once, then watched from the list's
        `resourceVersion` (no polling), listed again when the watch ends or the version is gone (`410`).
        `TimeoutError` after `timeout` seconds; `LookupError` when the object is deleted meanwhile."""
        found = await self._watch(list_method, namespace, name, done, timeout, gone_is_done=False)
        assert found is not None
        return found

    async def wait_gone(self, list_method: Callable[..., Any], namespace: str, name: str, timeout: float) -> None:
        """Return once the object `name` no longer exists: absent from a list, or its `DELETED` event on the
        watch that follows the list (an object held by finalizers stays until they are removed).
        `TimeoutError` after `timeout` seconds."""
        await self._watch(list_method, namespace, name, lambda _obj: False, timeout, gone_is_done=True)

    async def _watch(self, list_method: Callable[..., Any], namespace: str, name: str,
                     done: Callable[[dict[str, Any]], bool], timeout: float, *, gone_is_done: bool) -> dict[str, Any] | None:
        """List `name`, then watch it from the list's version until `done` holds (the object) or, with
        `gone_is_done`, until it is absent or deleted (None); a 410 Gone or the window's end lists again."""
        deadline = time.monotonic() + timeout
        field = f"metadata.name={name}"
        limit = self.settings.request_timeout_seconds

        def run() -> dict[str, Any] | None:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{name} was not done within {timeout:g} s")
                body = _decode(list_method(namespace, field_selector=field, _preload_content=False,
                                           _request_timeout=(limit, limit)))
                listed = [item for item in body.get("items") or [] if item["metadata"]["name"] == name]
                if gone_is_done and not listed:
                    return None
                for item in listed:
                    if done(item):
                        return dict(item)
                window = max(1, int(min(remaining, WATCH_WINDOW_SECONDS)))
                stream = watch.Watch()
                try:
                    for event in stream.stream(list_method, namespace, field_selector=field,
                                               resource_version=(body.get("metadata") or {}).get("resourceVersion"),
                                               timeout_seconds=window, _request_timeout=(limit, window + limit)):
                        obj = event.get("raw_object") or {}
                        if event.get("type") == "ERROR":
                            if obj.get("code") == 410:
                                break  # the version was compacted away: list again
                            raise RuntimeError(f"watching {name}: {obj.get('message') or obj}")
                        if (obj.get("metadata") or {}).get("name") != name:
                            continue
                        if event.get("type") == "DELETED":
                            if gone_is_done:
                                return None
                            raise LookupError(f"{name} was deleted")
                        if done(obj):
                            return dict(obj)
                except client.ApiException as exc:
                    if exc.status != 410:
                        raise
                except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
                    pass  # the window ended without a word: list again
                finally:
                    stream.stop()

        found = await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
        return dict(found) if found is not None else None

    async def in_own_namespaces(self, method: Callable[..., Any], *, labels: dict[str, str],
                                namespace_labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        """Objects carrying `labels` in every namespace the platform made (labelled as its own, and with
        `namespace_labels`): a list per namespace, since it may list nothing cluster-wide but namespaces."""
        namespaces = await self.items(self.core.list_namespace, labels=owned(namespace_labels))
        found: list[dict[str, Any]] = []
        for namespace in namespaces:
            found += await self.items(method, namespace["metadata"]["name"], labels=labels)
        return found

    async def create_or_patch(self, create: Callable[..., Any], patch: Callable[..., Any], body: dict[str, Any]) -> None:
        """Create the object, or merge-patch it into what exists (so each step is idempotent). `create`
        and `patch` are the client's methods with every argument but the body bound (`functools.partial`)."""
        try:
            await self.call(create, body)
        except client.ApiException as exc:
            if not conflict(exc):
                raise
            await self.call(patch, body, _content_type=MERGE_PATCH)

    async def ensure_namespace(self, namespace: str, project_id: str) -> None:
        """The project's provisioner creates the namespace; an object of a project whose namespace step
        failed repairs it here rather than failing every deploy (the quota step still needs a re-run)."""
        if await self.get(self.core.read_namespace, namespace) is None:
            body = {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": owned({PROJECT_LABEL: project_id})}}
            await self.create_or_patch(self.core.create_namespace, partial(self.core.patch_namespace, namespace), body)
            await self.bind_platform(namespace)

    async def bind_platform(self, namespace: str) -> None:
        """Grant the control plane `PROJECT_ROLE` in a namespace it made (its only rights there: least
        privilege, docs/kubernetes.md). The cluster's admission policy lets it bind only in namespaces
        labelled as its own."""
        await self.create_or_patch(partial(self.rbac.create_namespaced_role_binding, namespace),
                                   partial(self.rbac.patch_namespaced_role_binding, PROJECT_ROLE, namespace),
                                   role_binding_manifest(namespace, self.settings))

    async def delete(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> bool:
        """Delete in the background; False when it was already gone."""
        try:
            await self.call(method, *args, propagation_policy="Background", **kwargs)
        except client.ApiException as exc:
            if not_found(exc):
                return False
            raise
        return True

    async def close(self) -> None:
        await anyio.to_thread.run_sync(self.api.close)


def role_binding_manifest(namespace: str, settings: ClusterSettings) -> dict[str, Any]:
    return {"apiVersion": f"{RBAC_GROUP}/v1", "kind": "RoleBinding",
            "metadata": {"name": PROJECT_ROLE, "namespace": namespace, "labels": owned()},
            "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": PROJECT_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": settings.service_account,
                          "namespace": settings.platform_namespace}]}


def _decode(response: Any) -> Any:
    data = response.data if hasattr(response, "data") else response
    text = data.decode() if isinstance(data, bytes) else str(data or "")
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        return text


def _api_client(settings: ClusterSettings) -> client.ApiClient:
    if settings.host:
        configuration = client.Configuration()
        configuration.host = settings.host
        return client.ApiClient(configuration)
    if settings.kubeconfig:
        return config.new_client_from_config(config_file=settings.kubeconfig, context=settings.context)
    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        return config.new_client_from_config(context=settings.context)
