"""ResourceQuota and LimitRange admission, for the emulator (`kube_emulator.FilteringEmulator`) to refuse
what a cluster's quota refuses.

Written after their sources, so that what the emulator admits a cluster admits:

- the defaults a pod gets before admission (kubernetes/kubernetes `pkg/apis/core/v1/defaults.go`
  `SetDefaults_Pod`: a container with a limit and no request of that resource requests its limit);
- the LimitRanger admission plugin, which runs before the quota's (`plugin/pkg/admission/limitranger/
  admission.go` `defaultContainerResourceRequirements`, `mergeContainerResources`: a `Container`
  limit's `default` fills the limits a container does not set, `defaultRequest` the requests);
- what each object counts (`pkg/quota/v1/evaluator/core/pods.go` `PodUsageFunc` (a pod in a terminal
  phase counts nothing but `count/pods`; requests and limits summed over containers, at least the
  largest init container's: `pkg/api/v1/resource` `PodRequests`), `podComputeUsageHelper`;
  `services.go`, `persistent_volume_claims.go`; every other resource counts as `count/<resource>.<group>`,
  k8s.io/apiserver `pkg/quota/v1/generic/evaluator.go` `ObjectCountQuotaResourceNameFor`);
- the check itself (k8s.io/apiserver `pkg/admission/plugin/resourcequota/controller.go` `CheckRequest`):
  against each quota's `status.hard` and `status.used` (a quota the quota controller has not counted yet
  constrains nothing), a pod that does not set a cpu or memory request or limit a quota constrains is
  refused (`failed quota: <name>: must specify ...`: `pods.go` `Constraints`), a resource with a hard but
  no `used` yet is `status unknown`, and a request that would take a resource past its hard is
  `exceeded quota: <name>, requested: ..., used: ..., limited: ...`, each list sorted and printed as
  `resource=quantity` joined by commas (`prettyPrint`). The admitted request's usage is added to
  `status.used` at once, as the plugin does before the object is stored. All are 403 Forbidden, as
  `admission.NewForbidden` makes them: `<resource> "<name>" is forbidden: <reason>`.

Only creation is charged: a pod's requests and limits cannot change after it is made (the `resize`
subresource aside, which the platform does not use), and no update of the objects the platform's quota
counts (`adapters/kubernetes/projects.py` `QUOTA_RESOURCES`) changes what they count.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from caiplatform.quantity import format_quantity, parse_quantity
from caiplatform.testing.kube_admission import Refused

#: `pods.go` `validationSet`: a quota on these makes every container state them.
VALIDATED = ("cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory")
#: What the emulator charges on create: (plural, API group) -> the resource's name in a quota's list.
COUNTED = {("pods", ""): "pods", ("services", ""): "services", ("persistentvolumeclaims", ""): "persistentvolumeclaims",
           ("deployments", "apps"): "deployments.apps", ("statefulsets", "apps"): "statefulsets.apps",
           ("jobs", "batch"): "jobs.batch", ("secrets", ""): "secrets", ("configmaps", ""): "configmaps"}
_TERMINAL = ("Succeeded", "Failed")


def _containers(pod: Mapping[str, Any], key: str = "containers") -> list[dict[str, Any]]:
    return list((pod.get("spec") or {}).get(key) or [])


def with_defaults(pod: Mapping[str, Any], limit_ranges: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The pod as it is stored: requests defaulted from its own limits (`SetDefaults_Pod`), then what the
    namespace's LimitRanges give containers that set neither (`LimitRanger`)."""
    stored: dict[str, Any] = copy.deepcopy(dict(pod))
    defaults: dict[str, dict[str, str]] = {"limits": {}, "requests": {}}
    for limit_range in limit_ranges:
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if item.get("type") == "Container":
                for resource, value in (item.get("default") or {}).items():
                    defaults["limits"].setdefault(resource, str(value))
                for resource, value in (item.get("defaultRequest") or {}).items():
                    defaults["requests"].setdefault(resource, str(value))
    for key in ("initContainers", "containers"):
        for container in _containers(stored, key):
            resources = container.setdefault("resources", {})
            limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
            for resource, value in limits.items():
                requests.setdefault(resource, value)  # SetDefaults_Pod
            for resource, value in defaults["limits"].items():  # mergeContainerResources: only what is unset
                limits.setdefault(resource, value)
            for resource, value in defaults["requests"].items():
                requests.setdefault(resource, value)
            if limits:
                resources["limits"] = limits
            if requests:
                resources["requests"] = requests
    return stored


def _compute(requests: Mapping[str, Any], limits: Mapping[str, Any]) -> dict[str, int]:
    """`podComputeUsageHelper`: a count of 1 and each request and limit the container (or pod) states."""
    used = {"pods": 1}
    for name in ("cpu", "memory"):
        if name in requests:
            used[name] = used[f"requests.{name}"] = parse_quantity(f"requests.{name}", str(requests[name]))
        if name in limits:
            used[f"limits.{name}"] = parse_quantity(f"limits.{name}", str(limits[name]))
    return used


def _pod_totals(pod: Mapping[str, Any], key: str) -> dict[str, str]:
    """`PodRequests`/`PodLimits`: the containers' sum, raised to the largest init container's."""
    total: dict[str, int] = {}
    for container in _containers(pod):
        for name, value in ((container.get("resources") or {}).get(key) or {}).items():
            if name in ("cpu", "memory"):
                total[name] = total.get(name, 0) + parse_quantity(f"{key}.{name}", str(value))
    for container in _containers(pod, "initContainers"):
        for name, value in ((container.get("resources") or {}).get(key) or {}).items():
            if name in ("cpu", "memory"):
                total[name] = max(total.get(name, 0), parse_quantity(f"{key}.{name}", str(value)))
    return {name: format_quantity(f"{key}.{name}", value) for name, value in total.items()}


def usage(plural: str, group: str, obj: Mapping[str, Any]) -> dict[str, int]:
    """What one stored object counts against a quota (CPU in millicores, memory in bytes)."""
    counted = COUNTED.get((plural, group), f"{plural}.{group}" if group else plural)
    used = {f"count/{counted}": 1}
    if (plural, group) == ("pods", ""):
        if ((obj.get("status") or {}).get("phase")) in _TERMINAL:
            return used
        return used | _compute(_pod_totals(obj, "requests"), _pod_totals(obj, "limits"))
    if (plural, group) == ("services", ""):
        used["services"] = 1
        kind = (obj.get("spec") or {}).get("type")
        if kind == "LoadBalancer":
            used["services.loadbalancers"] = 1
        if kind in ("LoadBalancer", "NodePort"):
            used["services.nodeports"] = len((obj.get("spec") or {}).get("ports") or [])
    if (plural, group) == ("persistentvolumeclaims", ""):
        used["persistentvolumeclaims"] = 1
        storage = (((obj.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
        if storage is not None:
            used["requests.storage"] = parse_quantity("requests.storage", str(storage))
    return used


def total_usage(objects: Iterable[tuple[str, str, Mapping[str, Any]]]) -> dict[str, int]:
    """What the quota controller counts in a namespace: (plural, group, object) of everything in it."""
    total: dict[str, int] = {}
    for plural, group, obj in objects:
        for resource, value in usage(plural, group, obj).items():
            total[resource] = total.get(resource, 0) + value
    return total


def _missing(pod: Mapping[str, Any], required: set[str]) -> str | None:
    """`Constraints`: each container must state every cpu and memory resource a quota constrains."""
    missing: dict[str, set[str]] = {}
    for container in [*_containers(pod), *_containers(pod, "initContainers")]:
        resources = container.get("resources") or {}
        stated = set(_compute(resources.get("requests") or {}, resources.get("limits") or {}))
        for resource in required - stated:
            missing.setdefault(resource, set()).add(str(container.get("name")))
    if not missing:
        return None
    return "must specify " + "; ".join(f"{r} for: {','.join(sorted(missing[r]))}" for r in sorted(missing))


def _print(values: Mapping[str, int]) -> str:
    return ",".join(f"{r}={format_quantity(r, values[r])}" for r in sorted(values))


def charge(plural: str, group: str, obj: Mapping[str, Any], quotas: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Raise `Refused` as quota admission refuses creating `obj` under `quotas` (the namespace's); else each
    matching quota's name and its `status.used` with `obj` counted."""
    resource = COUNTED.get((plural, group), f"{plural}.{group}" if group else plural)
    name = (obj.get("metadata") or {}).get("name") or ""

    def refuse(reason: str) -> Refused:
        return Refused(403, "Forbidden", f'{resource} "{name}" is forbidden: {reason}')

    wanted = usage(plural, group, obj)
    charged: dict[str, dict[str, str]] = {}
    for quota in quotas:
        qname = (quota.get("metadata") or {}).get("name") or ""
        status = quota.get("status") or {}
        hard = {r: parse_quantity(r, str(v)) for r, v in (status.get("hard") or {}).items()}
        used = {r: parse_quantity(r, str(v)) for r, v in (status.get("used") or {}).items()}
        restricted = {r for r in hard if r in wanted or ((plural, group) == ("pods", "") and r in VALIDATED)}
        if not restricted:
            continue
        if (plural, group) == ("pods", ""):
            reason = _missing(obj, restricted & set(VALIDATED))
            if reason:
                raise refuse(f"failed quota: {qname}: {reason}")
        unknown = sorted(r for r in restricted if r not in (status.get("used") or {}))
        if unknown:
            raise refuse(f"status unknown for quota: {qname}, resources: {','.join(unknown)}")
        requested = {r: v for r, v in wanted.items() if r in hard and v}
        exceeded = sorted(r for r, v in requested.items() if used.get(r, 0) + v > hard[r])
        if exceeded:
            raise refuse(f"exceeded quota: {qname}, requested: {_print({r: requested[r] for r in exceeded})}, "
                         f"used: {_print({r: used.get(r, 0) for r in exceeded})}, "
                         f"limited: {_print({r: hard[r] for r in exceeded})}")
        charged[qname] = {r: format_quantity(r, used.get(r, 0) + requested.get(r, 0)) for r in status.get("used") or {}}
    return charged
