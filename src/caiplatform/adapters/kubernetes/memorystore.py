"""Memory stores on a cluster: a Valkey StatefulSet (one replica) per instance in the project's namespace.

Each instance is a StatefulSet `ms-<name>` (with a PersistentVolumeClaim template when persistence is
on), a Service `ms-<name>` on port 6379 (so the connection block reads `ms-<name>` in the project's
namespace), and the Secret `ms-<name>-credential` (`credential_secret`) holding the password in force
under `password`. Valkey reads its password from that key when it starts, so a rotation stores the new
one under `pending-password` and the old one stays in force until `restart`, which promotes it and rolls
the pod (as `kubectl rollout restart` does). The instance record is the StatefulSet itself: its
annotations keep the spec and the creation time; the provisioner finds instances by their labels.
"""

from __future__ import annotations

import base64
import contextlib
import json
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubernetes.client import ApiException

from caiplatform.adapters.kubernetes.client import (
    MERGE_PATCH,
    PART_LABEL,
    PROJECT_LABEL,
    ClusterRefused,
    ClusterSettings,
    KubeClient,
    api_message,
    owned,
    selector,
)
from caiplatform.clock import Clock, rfc3339
from caiplatform.domain.memorystore import Instance, InstanceSpec, State
from caiplatform.errors import Conflict
from caiplatform.ports.memorystore import MemoryStoreProvisioner, ProvisionerHealth

PORT = 6379
VALKEY_UID = 999  # the valkey image's own user
INSTANCE_LABEL = "caiplatform.dev/memorystore"
SPEC_ANNOTATION = "caiplatform.dev/memorystore-spec"
CREATED_ANNOTATION = "caiplatform.dev/created-at"
RESTART_ANNOTATION = "kubectl.kubernetes.io/restartedAt"
PASSWORD_KEY, PENDING_KEY = "password", "pending-password"


def object_name(name: str) -> str:
    return f"ms-{name}"


def namespace_of(spec: InstanceSpec) -> str:
    return f"cai-p-{spec.project_short}"


def instance_labels(spec: InstanceSpec) -> dict[str, str]:
    return owned({PROJECT_LABEL: spec.project_id, INSTANCE_LABEL: spec.name, PART_LABEL: "memorystore"})


def statefulset_manifest(spec: InstanceSpec, image: str, created_at: datetime) -> dict[str, Any]:
    name, labels = object_name(spec.name), instance_labels(spec)
    server = ["valkey-server", "--port", str(PORT), "--requirepass", "$(VALKEY_PASSWORD)",
              "--maxmemory", str(spec.size.maxmemory_bytes), "--maxmemory-policy", spec.maxmemory_policy, "--dir", "/data"]
    server += ["--appendonly", "yes"] if spec.persistence_enabled else ["--appendonly", "no", "--save", ""]
    container = {
        "name": "valkey", "image": image, "command": server,
        "env": [{"name": "VALKEY_PASSWORD", "valueFrom": {"secretKeyRef": {"name": spec.credential_secret, "key": PASSWORD_KEY}}}],
        "ports": [{"containerPort": PORT, "name": "redis"}],
        "resources": {"requests": {"cpu": "100m", "memory": spec.size.memory_limit},
                      "limits": {"memory": spec.size.memory_limit}},
        "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 5},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True, "runAsUser": VALKEY_UID,
                            "capabilities": {"drop": ["ALL"]}},
    }
    # fsGroup: a persistent volume's root is root's on most block storage; the kubelet hands it to Valkey's
    # group so that uid 999 can write /data (OnRootMismatch: only when it is not already).
    pod: dict[str, Any] = {"containers": [container], "automountServiceAccountToken": False, "enableServiceLinks": False,
                           "securityContext": {"runAsNonRoot": True, "runAsUser": VALKEY_UID, "runAsGroup": VALKEY_UID,
                                               "fsGroup": VALKEY_UID, "fsGroupChangePolicy": "OnRootMismatch",
                                               "seccompProfile": {"type": "RuntimeDefault"}}}
    sts_spec: dict[str, Any] = {
        "serviceName": name, "replicas": 1, "selector": {"matchLabels": {INSTANCE_LABEL: spec.name}},
        "template": {"metadata": {"labels": labels, "annotations": {RESTART_ANNOTATION: rfc3339(created_at)}}, "spec": pod},
    }
    if spec.persistence_enabled:
        claim: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": spec.persistence_size}}}
        if spec.storage_class_name:
            claim["storageClassName"] = spec.storage_class_name
        sts_spec["volumeClaimTemplates"] = [{"metadata": {"name": "data", "labels": labels}, "spec": claim}]
    else:
        pod["volumes"] = [{"name": "data", "emptyDir": {}}]
    return {"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": namespace_of(spec), "labels": labels,
                         "annotations": {SPEC_ANNOTATION: json.dumps(spec.to_json(), sort_keys=True),
                                         CREATED_ANNOTATION: rfc3339(created_at)}},
            "spec": sts_spec}


def service_manifest(spec: InstanceSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": object_name(spec.name), "namespace": namespace_of(spec), "labels": instance_labels(spec)},
            "spec": {"selector": {INSTANCE_LABEL: spec.name},
                     "ports": [{"name": "redis", "port": PORT, "targetPort": PORT, "protocol": "TCP"}]}}


def secret_manifest(spec: InstanceSpec, password: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": spec.credential_secret, "namespace": namespace_of(spec), "labels": instance_labels(spec)},
            "stringData": {PASSWORD_KEY: password}}


class ValkeyStatefulSetProvisioner(MemoryStoreProvisioner):
    name = "kubernetes"

    def __init__(self, kube: KubeClient | None = None, *, settings: ClusterSettings | None = None,
                 clock: Clock | None = None, **_: object):
        self.kube = kube or KubeClient(settings)
        self.clock = clock or Clock()

    def versions(self) -> list[str]:
        return [self.kube.settings.valkey_image.rpartition(":")[2] or "latest"]

    async def _find(self, project_id: str, name: str | None = None) -> list[dict[str, Any]]:
        labels = {PROJECT_LABEL: project_id, PART_LABEL: "memorystore"}
        if name is not None:
            labels[INSTANCE_LABEL] = name
        return await self.kube.in_own_namespaces(self.kube.apps.list_namespaced_stateful_set, labels=labels,
                                                 namespace_labels={PROJECT_LABEL: project_id})

    async def _observe(self, sts: dict[str, Any]) -> Instance:
        meta = sts["metadata"]
        spec = InstanceSpec.from_json(json.loads(meta["annotations"][SPEC_ANNOTATION]))
        ns = meta["namespace"]
        core = self.kube.core
        secret = await self.kube.get(core.read_namespaced_secret, spec.credential_secret, ns)
        service = await self.kube.get(core.read_namespaced_service, object_name(spec.name), ns)
        status = sts.get("status") or {}
        running = int(status.get("readyReplicas") or 0) >= 1
        state = State.READY if running and secret is not None and service is not None else State.PROVISIONING
        message = "" if state is State.READY else "the server is starting"
        if not running:
            refused = await self._refused(ns, meta["name"])
            if refused:  # the controller cannot make what the store needs: say why, not "starting"
                state, message = State.DEGRADED, refused
        return Instance(
            spec=spec, created_at=datetime.fromisoformat(meta["annotations"][CREATED_ANNOTATION].replace("Z", "+00:00")),
            state=state, host=f"{object_name(spec.name)}.{ns}.svc.cluster.local", port=PORT,
            credential_ready=secret is not None, service_ready=service is not None and running, workload_ready=running,
            message=message)

    async def _refused(self, namespace: str, name: str) -> str:
        """The StatefulSet controller's message when its newest create of the store's pod or claim failed (a
        quota's refusal, say), else "". The controller says so only in a `FailedCreate` event on the
        StatefulSet (kubernetes `pkg/controller/statefulset/stateful_pod_control.go`), followed by a
        `SuccessfulCreate` once a retry makes the pod."""
        events = await self.kube.items(self.kube.core.list_namespaced_event, namespace, labels={},
                                       field_selector=f"involvedObject.kind=StatefulSet,involvedObject.name={name}")
        creates = [e for e in events if e.get("reason") in ("FailedCreate", "SuccessfulCreate")]
        if not creates:
            return ""
        newest = max(creates, key=lambda e: (e.get("lastTimestamp") or e.get("eventTime") or "",
                                             (e.get("metadata") or {}).get("creationTimestamp") or ""))
        return str(newest.get("message") or "") if newest.get("reason") == "FailedCreate" else ""

    async def create(self, spec: InstanceSpec, password: str) -> Instance:
        if await self._find(spec.project_id, spec.name):
            raise Conflict("a memorystore with that name already exists in this project")
        ns, core, now = namespace_of(spec), self.kube.core, self.clock.now().astimezone(UTC)
        name = object_name(spec.name)
        await self.kube.ensure_namespace(ns, spec.project_id)
        try:
            await self.kube.create_or_patch(partial(core.create_namespaced_secret, ns),
                                            partial(core.patch_namespaced_secret, spec.credential_secret, ns),
                                            secret_manifest(spec, password))
            await self.kube.create_or_patch(partial(core.create_namespaced_service, ns),
                                            partial(core.patch_namespaced_service, name, ns), service_manifest(spec))
            manifest = statefulset_manifest(spec, self.kube.settings.valkey_image, now)
            await self.kube.call(self.kube.apps.create_namespaced_stateful_set, ns, manifest)
        except ApiException as exc:
            # Refused (the project's quota, say): nothing of the instance stays, and the caller reads the
            # API server's own reason, not the client's dump of the exchange.
            for delete, target in ((core.delete_namespaced_service, name),
                                   (core.delete_namespaced_secret, spec.credential_secret)):
                with contextlib.suppress(Exception):
                    await self.kube.delete(delete, target, ns)
            raise ClusterRefused(api_message(exc)) from exc
        return Instance(spec=spec, created_at=now, state=State.PROVISIONING, host=f"{name}.{ns}.svc.cluster.local",
                        port=PORT, credential_ready=True, message="the server is starting")

    async def get(self, project_id: str, name: str) -> Instance | None:
        found = await self._find(project_id, name)
        return await self._observe(found[0]) if found else None

    async def list(self, project_id: str) -> list[Instance]:
        instances = [await self._observe(sts) for sts in await self._find(project_id)]
        return sorted(instances, key=lambda i: i.spec.name)

    async def delete(self, project_id: str, name: str) -> Instance | None:
        found = await self._find(project_id, name)
        if not found:
            return None
        observed = await self._observe(found[0])
        ns, spec, core = found[0]["metadata"]["namespace"], observed.spec, self.kube.core
        await self.kube.delete(self.kube.apps.delete_namespaced_stateful_set, object_name(name), ns)
        await self.kube.delete(core.delete_namespaced_service, object_name(name), ns)
        await self.kube.delete(core.delete_namespaced_secret, spec.credential_secret, ns)
        # A StatefulSet's claims outlive it on purpose; deleting the instance destroys its data.
        for claim in await self.kube.items(core.list_namespaced_persistent_volume_claim, ns, labels=instance_labels(spec)):
            await self.kube.delete(core.delete_namespaced_persistent_volume_claim, claim["metadata"]["name"], ns)
        return observed.with_state(State.DELETING)

    async def _existing(self, project_id: str, name: str) -> dict[str, Any]:
        found = await self._find(project_id, name)
        if not found:
            raise LookupError(f"memory store {name} not found")
        return found[0]

    async def rotate_password(self, project_id: str, name: str, password: str) -> Instance:
        sts = await self._existing(project_id, name)
        ns, secret = sts["metadata"]["namespace"], f"ms-{name}-credential"
        await self.kube.call(self.kube.core.patch_namespaced_secret, secret, ns, {"stringData": {PENDING_KEY: password}},
                             _content_type=MERGE_PATCH)
        return await self._observe(sts)

    async def restart(self, project_id: str, name: str) -> Instance:
        sts = await self._existing(project_id, name)
        ns, secret_name = sts["metadata"]["namespace"], f"ms-{name}-credential"
        secret = await self.kube.get(self.kube.core.read_namespaced_secret, secret_name, ns) or {}
        pending = (secret.get("data") or {}).get(PENDING_KEY)  # base64, as the API server keeps it
        if pending is not None:
            await self.kube.call(self.kube.core.patch_namespaced_secret, secret_name, ns,
                                 {"data": {PASSWORD_KEY: pending, PENDING_KEY: None}}, _content_type=MERGE_PATCH)
        stamp = rfc3339(self.clock.now())
        await self.kube.call(self.kube.apps.patch_namespaced_stateful_set, object_name(name), ns,
                             {"spec": {"template": {"metadata": {"annotations": {RESTART_ANNOTATION: stamp}}}}},
                             _content_type=MERGE_PATCH)
        return await self._observe(await self._existing(project_id, name))

    async def info(self, project_id: str, name: str) -> str:
        """INFO over the instance's Service address (the platform runs in the cluster)."""
        from caiplatform.adapters.redis.info import read_info

        sts = await self._existing(project_id, name)
        ns = sts["metadata"]["namespace"]
        secret = await self.kube.get(self.kube.core.read_namespaced_secret, f"ms-{name}-credential", ns) or {}
        password = base64.b64decode((secret.get("data") or {}).get(PASSWORD_KEY, "")).decode()
        return await read_info(f"{object_name(name)}.{ns}.svc.cluster.local", PORT, password, retry=False)

    async def health(self) -> dict[str, ProvisionerHealth]:
        try:
            await self.kube.call(self.kube.core.list_namespace, limit=1, label_selector=selector(owned()))
        except Exception as exc:  # noqa: BLE001 - reported, not raised: this is a health check
            detail = api_message(exc)
            return {"kubernetes": ProvisionerHealth("unreachable", detail), "memorystore_crd": ProvisionerHealth("unreachable", detail)}
        return {"kubernetes": ProvisionerHealth("ok"),
                "memorystore_crd": ProvisionerHealth("ok", "instances are Valkey StatefulSets; no custom resource is needed")}

    async def close(self) -> None:
        await self.kube.close()
