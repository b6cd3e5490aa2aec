"""Strict schema checks for what the Kubernetes adapters write, and the RBAC check of their calls.

Core objects are validated with `kubernetes-validate` against the strict OpenAPI schemas of the two
newest Kubernetes minor versions it ships (offline); Knative objects against the models that
`cloudcoil-models-knative-serving` generates from Knative Serving's own CRDs. Those models ignore fields
they do not know, so a Knative object is parsed, dumped again and compared: any field the parse dropped
is a field Knative does not define, and fails.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from caiplatform.testing.kube_cluster import ApiCall
from caiplatform.testing.kube_emulator import snapshot

KNATIVE_GROUP = "serving.knative.dev"

# kubernetes-validate reads its (multi-megabyte) definitions file at every call; read each file once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)


def newest_versions(count: int = 2) -> list[str]:
    """The newest patch release of each of the `count` newest minor versions kubernetes-validate ships."""
    by_minor: dict[tuple[int, int], str] = {}
    for version in kubernetes_validate.utils.all_versions():
        major, minor, *_ = (int(part) for part in version.split("."))
        by_minor[(major, minor)] = max(by_minor.get((major, minor), version), version,
                                       key=lambda v: tuple(int(p) for p in v.split(".")))
    return [by_minor[key] for key in sorted(by_minor)[-count:]]


def _unknown_fields(given: Any, known: Any, path: str) -> list[str]:
    if isinstance(given, dict):
        if not isinstance(known, dict):
            return [path or "."]
        found = []
        for key, value in given.items():
            if key not in known:
                found.append(f"{path}.{key}")
            else:
                found += _unknown_fields(value, known[key], f"{path}.{key}")
        return found
    if isinstance(given, list) and isinstance(known, list):
        return [f for i, (a, b) in enumerate(zip(given, known, strict=False)) for f in _unknown_fields(a, b, f"{path}[{i}]")]
    return []


def validate_knative(obj: dict[str, Any]) -> None:
    from cloudcoil.models.knative_serving.serving import v1

    model = getattr(v1, obj["kind"])
    parsed = model.model_validate(obj)  # raises on a wrong type or a missing required field
    unknown = _unknown_fields(obj, parsed.model_dump(by_alias=True, exclude_unset=True, mode="json"), "")
    if unknown:
        raise ValueError(f"{obj['kind']} {obj['metadata'].get('name')}: fields Knative does not define: {unknown}")


def validate_object(obj: dict[str, Any], versions: Iterable[str] | None = None) -> None:
    """Raise when `obj` is not valid for a cluster (every version of `versions`, default the two newest)."""
    if obj.get("apiVersion", "").startswith(KNATIVE_GROUP + "/"):
        validate_knative(obj)
        return
    for version in versions or newest_versions():
        kubernetes_validate.validate(obj, version, strict=True)


def load_documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for file in ([path] if path.is_file() else sorted(path.glob("*.yaml"))) for doc in load_documents(file)]


def cluster_role(path: Path, name: str = "caiplatform") -> dict[str, Any]:
    for doc in _documents(path):
        if doc.get("kind") == "ClusterRole" and doc["metadata"]["name"] == name:
            return doc
    raise LookupError(f"no ClusterRole {name} in {path}")


def allowed(role: dict[str, Any], call: ApiCall) -> bool:
    for rule in role.get("rules") or []:
        if (call.group in rule.get("apiGroups", []) and call.resource in rule.get("resources", [])
                and call.verb in rule.get("verbs", []) and not rule.get("resourceNames")):
            return True
    return False


class Grants:
    """RBAC as the API server evaluates it for the control plane's ServiceAccount: ClusterRoles bound
    cluster-wide by a ClusterRoleBinding, and ClusterRoles bound in one namespace by a RoleBinding (those the
    manifests ship and those the platform itself wrote to the cluster)."""

    def __init__(self, role_path: Path, written: list[dict[str, Any]] = ()):  # type: ignore[assignment]
        docs = _documents(role_path)
        self.roles = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ClusterRole"}
        self.cluster_wide = [d["roleRef"]["name"] for d in docs if d.get("kind") == "ClusterRoleBinding"]
        self.namespaced: dict[str, set[str]] = {}
        for d in [*docs, *written]:
            if d.get("kind") == "RoleBinding" and d.get("roleRef", {}).get("kind") == "ClusterRole":
                self.namespaced.setdefault(d["metadata"]["namespace"], set()).add(d["roleRef"]["name"])

    def allows(self, call: ApiCall) -> bool:
        names = [*self.cluster_wide, *(self.namespaced.get(call.namespace or "", set()) if call.namespace else ())]
        return any(allowed(self.roles[n], call) for n in names if n in self.roles)

    def rules(self) -> list[tuple[str, str, str]]:
        bound = set(self.cluster_wide) | {n for names in self.namespaced.values() for n in names}
        return [(g, r, v) for name in sorted(bound) if name in self.roles
                for rule in self.roles[name].get("rules") or [] if not rule.get("resourceNames")
                for g in rule.get("apiGroups", []) for r in rule.get("resources", []) for v in rule.get("verbs", [])]


def forbidden_calls(grants: Grants, calls: Iterable[ApiCall]) -> list[ApiCall]:
    seen, refused = set(), []
    for call in calls:
        key = (call.verb, call.group, call.resource, call.namespace)
        if key not in seen:
            seen.add(key)
            if not grants.allows(call):
                refused.append(call)
    return refused


def unused_rules(grants: Grants, calls: Iterable[ApiCall]) -> list[tuple[str, str, str]]:
    """(group, resource, verb) the bound roles grant that no call used: grants beyond what the adapters need."""
    used = {(c.group, c.resource, c.verb) for c in calls}
    return sorted({grant for grant in grants.rules() if grant not in used})


def written_objects(emulator: Any) -> list[dict[str, Any]]:
    """The last state of every object an adapter created (its patches included, the controllers' `status`
    left out), deleted ones too."""
    keys = []
    for request in list(emulator):
        method = str(getattr(request.method, "value", request.method)).upper()
        if method == "POST" and request.resource is not None and isinstance(request.data, dict):
            meta = request.data.get("metadata") or {}
            key = (request.resource, request.namespace or meta.get("namespace"), meta.get("name"))
            if key not in keys:
                keys.append(key)
    objects = []
    for key in keys:
        if key in emulator.objects:
            last = dict(emulator.objects[key].last.raw)
            last.pop("status", None)
            objects.append(last)
    return objects


def audit(emulator: Any, calls: list[ApiCall], role_path: Path) -> None:
    """Fail when an object the adapters wrote is invalid or when they made a call the role forbids."""
    versions = newest_versions()
    errors = []
    for obj in written_objects(emulator):
        try:
            validate_object(obj, versions)
        except Exception as exc:  # noqa: BLE001 - every invalid object is reported, not just the first
            errors.append(f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {str(exc)[:400]}")
    # A call into a namespace that did not exist was answered 403 by the emulator, as a cluster answers it
    # (`FilteringEmulator._authorize`), which `KubeClient` reads as "nothing there": no grant is missing.
    namespaces = {name for (res, _ns, name), _obj in snapshot(emulator) if res.plural == "namespaces"}
    refused = [c for c in forbidden_calls(Grants(role_path, written_objects(emulator)), calls)
               if c.namespace is None or c.namespace in namespaces]
    errors += [f"RBAC does not allow {c.verb} {c.resource} (group {c.group!r}) in namespace {c.namespace!r}"
               for c in refused]
    assert not errors, "\n".join(errors)
