"""One connection to the API server, shared by the Kubernetes adapters.

The official client is synchronous: every call goes through `KubeClient.call`, which runs it in a worker
thread so the event loop never blocks. Objects travel as plain JSON mappings (camelCase, as on the
wire): requests are sent with `_preload_content=False` and the body is decoded here, so the adapters
read exactly what the server answered and write exactly what the manifests say.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio

from kubernetes import client, config

#: Every object an adapter creates carries these labels (and `PART_LABEL` naming what it is for).
MANAGED_BY = {"app.kubernetes.io/managed-by": "caiplatform"}
PROJECT_LABEL = "caiplatform.dev/project"
WORKLOAD_LABEL = "caiplatform.dev/workload"
KIND_LABEL = "caiplatform.dev/kind"
PART_LABEL = "caiplatform.dev/part"
MERGE_PATCH = "application/merge-patch+json"

KNATIVE_GROUP, KNATIVE_VERSION = "serving.knative.dev", "v1"


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


@dataclass(frozen=True)
class ClusterSettings:
    """Where the cluster is and what the adapters run on it (from `caiplatform.settings.Settings`)."""

    kubeconfig: str | None = None  # a kubeconfig path; None: in-cluster config, then ~/.kube/config
    host: str | None = None  # an API server address without credentials (tests, `kubectl proxy`)
    context: str | None = None
    platform_namespace: str = "caiplatform"
    build_namespace: str = "caiplatform"  # build Jobs share the build-context volume with the control plane
    harness_image: str = "ghcr.io/caiplatform/harness:latest"
    builder_image: str = "gcr.io/kaniko-project/executor:v1.23.2"
    valkey_image: str = "docker.io/valkey/valkey:8.1"
    build_push_secret: str | None = None  # a dockerconfigjson Secret in the build namespace, for kaniko's push
    build_insecure_registry: bool = False  # plain HTTP, or a certificate kaniko cannot check


def cluster_settings(settings: Any) -> ClusterSettings:
    """The cluster part of `caiplatform.settings.Settings`."""
    return ClusterSettings(kubeconfig=settings.kubeconfig, host=settings.kube_api_url, context=settings.kube_context,
                           platform_namespace=settings.platform_namespace, build_namespace=settings.build_namespace,
                           harness_image=settings.harness_image, builder_image=settings.builder_image,
                           valkey_image=settings.valkey_image, build_push_secret=settings.build_push_secret,
                           build_insecure_registry=settings.build_insecure_registry)


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

    async def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one API call in a worker thread; the decoded JSON body (or the text of a log)."""
        return await anyio.to_thread.run_sync(lambda: _decode(method(*args, _preload_content=False, **kwargs)))

    async def get(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        """A read that answers None for an object that does not exist."""
        try:
            result: dict[str, Any] = await self.call(method, *args, **kwargs)
        except client.ApiException as exc:
            if not_found(exc):
                return None
            raise
        return result

    async def items(self, method: Callable[..., Any], *args: Any, labels: dict[str, str], **kwargs: Any) -> list[dict[str, Any]]:
        """Objects of a list call carrying every one of `labels`."""
        body = await self.call(method, *args, label_selector=selector(labels), **kwargs)
        return list(body.get("items") or [])

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
