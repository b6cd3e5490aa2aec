"""The code sandbox's warm pool on a cluster: pods started ahead, each runs one snippet and is deleted.

The same contract as the local `caiplatform.codesandbox.WarmPool` (`start`, `acquire`, `release`,
`describe`, `close`), so `CodeSandboxService` runs on either. A warm sandbox is a bare Pod in the sandbox
namespace (`CAI_CODE_SANDBOX_NAMESPACE`) running `python -m caiplatform.codesandbox.pod_server` from the
harness image: it is ready when its readiness probe (`GET /ready`) passes, takes one `POST /run` on its own
address (the runner's request and answer, `codesandbox/runner.py`), then exits; the platform deletes it
and a fresh pod takes its place. Limits 1 CPU and 512 MiB (requests equal to limits), no service-account
token, no host namespaces, a non-root user without privileges, a read-only root filesystem with an
`emptyDir` for `/tmp`, and `runtimeClassName: gvisor` where the operator says the cluster has it
(`CAI_KUBE_GVISOR`). A NetworkPolicy of the namespace denies the pods all egress (unless
`CAI_CODE_SANDBOX_NETWORK`) and admits only the control plane's namespace to the runner's port.

A snippet killed for memory takes the whole container with it (cgroup v2 kills the container's group):
the call to the pod breaks and its status says `OOMKilled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import httpx

from caiplatform.adapters.kubernetes.client import KIND_LABEL, PART_LABEL, ClusterSettings, KubeClient, owned
from caiplatform.codesandbox.limits import SandboxLimits
from caiplatform.codesandbox.pool import BasePool, RunOutcome

log = logging.getLogger(__name__)

PART = "code-sandbox"
OWNER_LABEL = "caiplatform.dev/sandbox-pool"  # which control-plane process made the pod
PORT = 8080
READY_SECONDS = 120.0  # a pod that is not ready by then (image pull included) is deleted and replaced
SANDBOX_UID = 65532
POLICY_NAME = "code-sandbox"
#: A pool's lease on its pods: renewed every third of it; the pods of an owner whose lease ran out (or that
#: has none) and that are older than it are a crashed replica's, and the next pool to look deletes them.
LEASE_SECONDS = 30.0
#: Interpreters in the harness image (`backends/kubernetes/Containerfile.harness`), on its PATH.
POD_LANGUAGES = {"python": ["python"], "shell": ["bash"], "nodejs": ["node"]}


@dataclass
class PodSandbox:
    """One warm pod, claimed by a caller for its one snippet."""

    id: str
    address: str
    pool: KubernetesWarmPool
    started: float = field(default_factory=time.monotonic)

    async def run(self, request: dict[str, Any], deadline: float) -> RunOutcome:
        try:
            response = await self.pool.http.post(f"http://{self.address}:{PORT}/run", json=request, timeout=deadline)
            if response.status_code == 200:
                return RunOutcome(response.json(), False, "")
            why = f"the sandbox pod answered {response.status_code}: {response.text[:500]}"
        except (httpx.HTTPError, ValueError) as exc:
            why = f"the sandbox pod stopped answering: {type(exc).__name__}"
        terminated = await self.pool.termination(self.id)
        if terminated.get("reason") == "OOMKilled":
            return RunOutcome(None, True, "OOMKilled")
        return RunOutcome(None, False, f"{why} {terminated.get('message') or ''}".strip())

    async def discard(self) -> None:
        await self.pool.delete_pod(self.id)


class KubernetesWarmPool(BasePool[PodSandbox]):
    """At most `size` code sandbox pods at a time, warm or running one snippet (document 1's warm pool)."""

    unit = "pod"

    languages = POD_LANGUAGES

    def __init__(self, settings: ClusterSettings, limits: SandboxLimits, *, namespace: str = "caiplatform-sandbox",
                 image: str | None = None, size: int | None = None, wait_seconds: float | None = None,
                 network: bool = False, gvisor: bool = False, name: str = "code",
                 transport: httpx.AsyncBaseTransport | None = None, ready_seconds: float = READY_SECONDS,
                 kube: KubeClient | None = None, lease_seconds: float = LEASE_SECONDS):
        super().__init__(limits, name=name, size=size, wait_seconds=wait_seconds, network=network)
        self.settings = settings
        self.kube = kube or KubeClient(settings)
        self.namespace = namespace
        self.image = image or settings.harness_image
        self.runtime_class = "gvisor" if gvisor else None
        self.ready_seconds = ready_seconds
        self.http = httpx.AsyncClient(transport=transport, timeout=30)
        self.owner = f"{socket.gethostname()[:30]}-{os.getpid()}-{secrets.token_hex(3)}".lower().replace("_", "-")
        self.lease_seconds = lease_seconds
        self._prepared = False
        self._leasing: asyncio.Task[None] | None = None

    # -- the objects ---------------------------------------------------------------------------------

    def pod(self, name: str) -> dict[str, Any]:
        """The Pod of one warm sandbox."""
        resources = {"cpu": self.limits.cpu, "memory": self.limits.memory}
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False, "hostPID": False, "hostIPC": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": SANDBOX_UID, "runAsGroup": SANDBOX_UID,
                                "fsGroup": SANDBOX_UID, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sandbox",
                "image": self.image,
                "command": ["python", "-m", "caiplatform.codesandbox.pod_server", str(PORT), "/tmp/work"],
                "ports": [{"name": "runner", "containerPort": PORT, "protocol": "TCP"}],
                "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
                "resources": {"limits": dict(resources), "requests": dict(resources)},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": PORT}, "periodSeconds": 1,
                                   "failureThreshold": 1},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
            }],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}],
        }
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace,
                             "labels": owned({PART_LABEL: PART, KIND_LABEL: "code-sandbox", OWNER_LABEL: self.owner})},
                "spec": spec}

    def network_policy(self) -> dict[str, Any]:
        """The sandbox pods: reached only from the control plane's namespace on the runner's port; no egress."""
        policy: dict[str, Any] = {
            "podSelector": {"matchLabels": {PART_LABEL: PART}},
            "policyTypes": ["Ingress"] if self.network else ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": self.settings.platform_namespace}}}],
                "ports": [{"protocol": "TCP", "port": PORT}]}],
        }
        if not self.network:
            policy["egress"] = []
        return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": POLICY_NAME, "namespace": self.namespace, "labels": owned({PART_LABEL: PART})},
                "spec": policy}

    async def _prepare(self) -> None:
        """The sandbox namespace and its network policy (idempotent)."""
        if self._prepared:
            return
        core, net = self.kube.core, self.kube.networking
        if await self.kube.get(core.read_namespace, self.namespace) is None:
            # Pod Security "restricted" enforced on every pod of the namespace (the pods meet it).
            body = {"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": self.namespace, "labels": owned({
                        PART_LABEL: PART, "pod-security.kubernetes.io/enforce": "restricted",
                        "pod-security.kubernetes.io/enforce-version": "latest"})}}
            await self.kube.create_or_patch(core.create_namespace, partial(core.patch_namespace, self.namespace), body)
            await self.kube.bind_platform(self.namespace)
        await self.kube.create_or_patch(partial(net.create_namespaced_network_policy, self.namespace),
                                        partial(net.patch_namespaced_network_policy, POLICY_NAME, self.namespace),
                                        self.network_policy())
        await self.renew_lease()  # before this pool's first pod, so no other pool takes its pods for orphans
        # Pods that ended and were never deleted (a replica that stopped mid-snippet): of no use to anyone.
        for pod in await self.kube.items(core.list_namespaced_pod, self.namespace, labels={PART_LABEL: PART}):
            if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
                log.info("%s sandbox pool: deleting ended pod %s", self.name, pod["metadata"]["name"])
                await self.delete_pod(pod["metadata"]["name"])
        self._prepared = True

    async def delete_pod(self, name: str) -> None:
        with contextlib.suppress(Exception):
            await self.kube.delete(self.kube.core.delete_namespaced_pod, name, self.namespace, grace_period_seconds=0)

    async def termination(self, name: str) -> dict[str, Any]:
        """How the pod's container ended (`reason`, `exitCode`, `message`), {} while it runs or when gone."""
        pod = await self.kube.get(self.kube.core.read_namespaced_pod, name, self.namespace)
        for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            for state in (status.get("state") or {}, status.get("lastState") or {}):
                if state.get("terminated"):
                    return dict(state["terminated"])
        return {}

    # -- the lease: whose warm pods are still someone's -------------------------------------------------

    @staticmethod
    def lease_name(owner: str) -> str:
        return f"{PART}-{owner}"[:63].rstrip("-")

    def lease(self) -> dict[str, Any]:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.lease_name(self.owner), "namespace": self.namespace,
                             "labels": owned({PART_LABEL: PART, OWNER_LABEL: self.owner})},
                "spec": {"holderIdentity": self.owner, "leaseDurationSeconds": max(1, math.ceil(self.lease_seconds)),
                         "renewTime": now}}

    async def renew_lease(self) -> None:
        coordination = self.kube.coordination
        name = self.lease_name(self.owner)
        await self.kube.create_or_patch(partial(coordination.create_namespaced_lease, self.namespace),
                                        partial(coordination.patch_namespaced_lease, name, self.namespace),
                                        self.lease())

    async def lease_ran_out(self, owner: str, now: datetime | None = None) -> bool:
        """Whether `owner`'s lease is gone or older than its duration (its pods are nobody's)."""
        now = now or datetime.now(UTC)
        lease = await self.kube.get(self.kube.coordination.read_namespaced_lease, self.lease_name(owner), self.namespace)
        spec = (lease or {}).get("spec") or {}
        renewed = _timestamp(spec.get("renewTime"))
        if renewed is None:
            return True
        return now - renewed > timedelta(seconds=float(spec.get("leaseDurationSeconds") or self.lease_seconds))

    async def sweep(self) -> list[str]:
        """Delete the pods of every other owner whose lease ran out (a crashed replica's warm pods, which
        nothing else would remove) and that lease; the pods' names."""
        now = datetime.now(UTC)
        grace = timedelta(seconds=self.lease_seconds)
        pods = await self.kube.items(self.kube.core.list_namespaced_pod, self.namespace, labels={PART_LABEL: PART})
        verdicts: dict[str, bool] = {}
        swept: list[str] = []
        for pod in pods:
            meta = pod.get("metadata") or {}
            owner = (meta.get("labels") or {}).get(OWNER_LABEL)
            created = _timestamp(meta.get("creationTimestamp"))
            if not owner or owner == self.owner or (created is not None and now - created <= grace):
                continue  # ours, or too young to have missed a renewal
            if owner not in verdicts:
                verdicts[owner] = await self.lease_ran_out(owner, now)
            if verdicts[owner]:
                log.warning("%s sandbox pool: deleting pod %s of %s, whose lease ran out", self.name, meta["name"], owner)
                await self.delete_pod(meta["name"])
                swept.append(meta["name"])
        for owner, ran_out in verdicts.items():
            if ran_out:
                with contextlib.suppress(Exception):
                    await self.kube.delete(self.kube.coordination.delete_namespaced_lease, self.lease_name(owner),
                                           self.namespace)
        return swept

    async def _keep_lease(self) -> None:
        while True:
            try:
                if self._prepared:
                    await self.renew_lease()
                    await self.sweep()
            except Exception as exc:  # noqa: BLE001 - tried again at the next renewal
                log.warning("%s sandbox pool: renewing the lease or sweeping failed: %s", self.name, exc)
            await asyncio.sleep(self.lease_seconds / 3)

    def start(self) -> None:
        super().start()
        if self._leasing is None or self._leasing.done():
            self._leasing = asyncio.get_running_loop().create_task(self._keep_lease(), name=f"{self.name}-pool-lease")

    # -- lifecycle -----------------------------------------------------------------------------------

    def _announce(self) -> None:
        log.info("%s sandbox pool: keeping %d warm pods in namespace %s (runtime class %s, network %s)", self.name,
                 self.size, self.namespace, self.runtime_class or "default", "allowed" if self.network else "none")

    async def close(self) -> None:
        await self._stop_filling()
        if self._leasing is not None:
            self._leasing.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._leasing
        with contextlib.suppress(Exception):
            await self.kube.delete(self.kube.coordination.delete_namespaced_lease, self.lease_name(self.owner),
                                   self.namespace)
        with contextlib.suppress(Exception):  # every pod this process made, warm or starting
            for pod in await self.kube.items(self.kube.core.list_namespaced_pod, self.namespace,
                                             labels={PART_LABEL: PART, OWNER_LABEL: self.owner}):
                await self.delete_pod(pod["metadata"]["name"])
        while not self._ready.empty():
            self._ready.get_nowait()
        await self.http.aclose()
        await self.kube.close()

    def _described(self) -> dict[str, Any]:
        return {"backend": "kubernetes", "namespace": self.namespace, "runtime_class": self.runtime_class}

    async def _before_fill(self) -> None:
        try:
            await self._prepare()
        except Exception as exc:
            raise RuntimeError(f"preparing namespace {self.namespace}: {exc}") from exc

    async def _start_one(self) -> PodSandbox:
        name = f"{self.name}-sandbox-{secrets.token_hex(5)}"
        await self.kube.call(self.kube.core.create_namespaced_pod, self.namespace, self.pod(name))
        try:
            # Listed once, then watched from the list's version until it is ready or ended (no polling).
            pod = await self.kube.wait_for(self.kube.core.list_namespaced_pod, self.namespace, name, _settled,
                                           self.ready_seconds)
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                raise RuntimeError(f"sandbox pod {name} ended before it was used: {status.get('reason') or 'ended'}")
            log.debug("%s sandbox pool: %s is warm", self.name, name)
            return PodSandbox(name, status["podIP"], self)
        except TimeoutError:
            await self.delete_pod(name)
            raise RuntimeError(f"sandbox pod {name} was not ready within {self.ready_seconds:.0f} s") from None
        except LookupError:
            raise RuntimeError(f"sandbox pod {name} ended before it was used: gone") from None
        except BaseException:
            await self.delete_pod(name)
            raise

    # -- use -----------------------------------------------------------------------------------------

    async def _still_warm(self, sandbox: PodSandbox) -> bool:
        pod = await self.kube.get(self.kube.core.read_namespaced_pod, sandbox.id, self.namespace)
        if pod is not None and ((pod.get("status") or {}).get("phase")) == "Running":
            return True
        log.warning("%s sandbox pool: pod %s went away while warm; replaced", self.name, sandbox.id)
        return False


def _settled(pod: dict[str, Any]) -> bool:
    """A pod that is ready (with its address), or that ended before it was."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and bool(status.get("podIP"))


def _timestamp(value: Any) -> datetime | None:
    """A Kubernetes time (RFC 3339, `Z`, with or without fractions) as an aware datetime, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


__all__ = ["KubernetesWarmPool", "PodSandbox"]
