"""Projects on a cluster: a namespace per project, its ResourceQuota, LimitRange and NetworkPolicy.

The quota's resources are exactly the spec's quota table (document 2); the LimitRange gives containers
without requests the spec's per-container defaults so they still fit the quota; the NetworkPolicy denies
ingress except from the project's own namespace, the platform's namespace and Knative's (its activator
and ingress gateways deliver requests to workloads). The quota view reads `status.hard`/`status.used`
(the runtime's `usage`), which is what "live from cluster enforcement" means.

The model credential and the cache access user are not cluster objects: they are recorded as
annotations on the namespace, so `provisioned` reads every step from the cluster.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from caiplatform.adapters.kubernetes.client import (
    MERGE_PATCH,
    PROJECT_LABEL,
    ClusterSettings,
    KubeClient,
    owned,
)
from caiplatform.clock import Clock, rfc3339
from caiplatform.ports.projects import PROVISION_STEPS, ProjectProvisioner, ProjectSpec

#: The spec's quota table, in its order.
QUOTA_RESOURCES = ("pods", "services", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory",
                   "count/deployments.apps", "persistentvolumeclaims")
QUOTA_NAME = "cai-quota"
LIMIT_RANGE_NAME = "cai-defaults"
NETWORK_POLICY_NAME = "cai-default-deny"
#: The spec's per-container defaults (document 2, operator settings).
CONTAINER_DEFAULTS = {"default": {"cpu": "2", "memory": "4Gi"}, "defaultRequest": {"cpu": "100m", "memory": "256Mi"}}
#: Knative's activator, and the ingress gateways that send to a scaled-up revision's pods directly
#: (Kourier's, Istio's); a cluster with another gateway adds its namespace to the policy by hand.
KNATIVE_NAMESPACES = ("knative-serving", "kourier-system", "istio-system")
STEP_ANNOTATION = "caiplatform.dev/step-"


def project_labels(project: ProjectSpec) -> dict[str, str]:
    return owned({PROJECT_LABEL: project.id})


def quota_hard(project: ProjectSpec) -> dict[str, str]:
    """The project's hards for the table's resources; "0" (unlimited in the spec) leaves a resource out,
    because a hard of 0 in a ResourceQuota forbids it instead."""
    return {r: str(project.quota[r]) for r in QUOTA_RESOURCES if r in project.quota and str(project.quota[r]) not in ("0", "")}


def namespace_manifest(project: ProjectSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": project.namespace, "labels": {**project_labels(project), "caiplatform.dev/org": project.org_id},
                         "annotations": {"caiplatform.dev/project-slug": project.slug}}}


def quota_manifest(project: ProjectSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA_NAME, "namespace": project.namespace, "labels": project_labels(project)},
            "spec": {"hard": quota_hard(project)}}


def limit_range_manifest(project: ProjectSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "LimitRange",
            "metadata": {"name": LIMIT_RANGE_NAME, "namespace": project.namespace, "labels": project_labels(project)},
            "spec": {"limits": [{"type": "Container", **CONTAINER_DEFAULTS}]}}


def network_policy_manifest(project: ProjectSpec, platform_namespace: str) -> dict[str, Any]:
    admitted = sorted({project.namespace, platform_namespace, *KNATIVE_NAMESPACES})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": NETWORK_POLICY_NAME, "namespace": project.namespace, "labels": project_labels(project)},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchExpressions": [
                         {"key": "kubernetes.io/metadata.name", "operator": "In", "values": admitted}]}}]}]}}


class KubernetesProjectProvisioner(ProjectProvisioner):
    def __init__(self, kube: KubeClient | None = None, *, settings: ClusterSettings | None = None,
                 clock: Clock | None = None, **_: object):
        self.kube = kube or KubeClient(settings)
        self.clock = clock or Clock()

    async def _apply(self, manifest: dict[str, Any], create: Any, patch: Any) -> None:
        await self.kube.create_or_patch(create, patch, manifest)

    async def namespace(self, project: ProjectSpec) -> None:
        core = self.kube.core
        await self._apply(namespace_manifest(project), core.create_namespace, partial(core.patch_namespace, project.namespace))
        await self.kube.bind_platform(project.namespace)

    async def quota(self, project: ProjectSpec) -> None:
        core, ns = self.kube.core, project.namespace
        await self._apply(quota_manifest(project), partial(core.create_namespaced_resource_quota, ns),
                          partial(core.patch_namespaced_resource_quota, QUOTA_NAME, ns))
        await self._apply(limit_range_manifest(project), partial(core.create_namespaced_limit_range, ns),
                          partial(core.patch_namespaced_limit_range, LIMIT_RANGE_NAME, ns))

    async def network_policy(self, project: ProjectSpec) -> None:
        net, ns = self.kube.networking, project.namespace
        await self._apply(network_policy_manifest(project, self.kube.settings.platform_namespace),
                          partial(net.create_namespaced_network_policy, ns),
                          partial(net.patch_namespaced_network_policy, NETWORK_POLICY_NAME, ns))

    async def _annotate(self, project: ProjectSpec, step: str, value: str) -> None:
        body = {"metadata": {"annotations": {STEP_ANNOTATION + step: value}}}
        await self.kube.call(self.kube.core.patch_namespace, project.namespace, body, _content_type=MERGE_PATCH)

    async def model_credential(self, project: ProjectSpec) -> None:
        # Workloads get the platform model key through their revision's Secret (DECISIONS.md, Models).
        await self._annotate(project, "model_credential", f"platform model key, {rfc3339(self.clock.now())}")

    async def cache_access_user(self, project: ProjectSpec) -> None:
        await self._annotate(project, "cache_access_user", project.namespace)

    async def deprovision(self, project: ProjectSpec) -> None:
        await self.kube.delete(self.kube.core.delete_namespace, project.namespace)

    async def provisioned(self, project: ProjectSpec) -> list[str]:
        core, ns = self.kube.core, project.namespace
        namespace = await self.kube.get(core.read_namespace, ns)
        if namespace is None or (namespace.get("metadata", {}).get("labels") or {}).get(PROJECT_LABEL) != project.id:
            return []
        if namespace["metadata"].get("deletionTimestamp"):
            return []  # terminating: deprovisioned, the cluster is still removing what it held
        annotations = namespace["metadata"].get("annotations") or {}
        present = {
            "namespace": True,
            "quota": await self.kube.get(core.read_namespaced_resource_quota, QUOTA_NAME, ns) is not None,
            "network_policy": await self.kube.get(self.kube.networking.read_namespaced_network_policy,
                                                  NETWORK_POLICY_NAME, ns) is not None,
            "model_credential": STEP_ANNOTATION + "model_credential" in annotations,
            "cache_access_user": STEP_ANNOTATION + "cache_access_user" in annotations,
        }
        return [step for step in PROVISION_STEPS if present[step]]

    async def close(self) -> None:
        await self.kube.close()
