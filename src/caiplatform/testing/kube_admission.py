"""What a real API server and Knative's webhook refuse, for the emulator to refuse too (`admit`).

The emulator (`kube_emulator.FilteringEmulator`) stores whatever it is sent, and the schema audit
(`kube_schemas`) checks types and field names only: neither knows that a label key may hold one `/`, that a
revision must be named after its service, or that Knative's webhook refuses `runtimeClassName` by default.
These rules are written here after their sources, so that what passes the emulator passes a cluster:

- object metadata, as the API server validates it (kubernetes/apimachinery
  `pkg/api/validation/objectmeta.go` `ValidateObjectMetaAccessor`, `ValidateAnnotations`
  (keys are qualified names, 256 KiB in all); `pkg/apis/meta/v1/validation/validation.go` `ValidateLabels`;
  `pkg/api/validate/content/kube.go` `IsLabelKey`/`IsLabelValue`; `pkg/api/validate/content/dns.go`
  `IsDNS1123Label`/`IsDNS1123Subdomain`/`IsDNS1035Label`);
- object names per kind (kubernetes/kubernetes `pkg/apis/core/validation/validation.go`: a Namespace is a
  DNS-1123 label, a Service a DNS-1035 label, other objects DNS-1123 subdomains; `pkg/apis/batch/validation`:
  a Job's name is also a label value on its pods, so at most 63 characters);
- Knative Serving's webhook with its default feature flags (knative/serving `pkg/apis/serving/fieldmask.go`
  `PodSpecMask`, `pkg/apis/config/features.go` `defaultFeaturesConfig`; `pkg/apis/serving/v1/
  revision_validation.go` `validateRevisionName` (a DNS-1035 label prefixed `<service>-`) and
  `VerifyNameChange` (a named template cannot change under the same name); knative/pkg
  `apis/metadata_validation.go`: a Knative object's name is a DNS-1035 label);
- Pod Security "restricted" for pods in a namespace labelled `pod-security.kubernetes.io/enforce=restricted`
  (kubernetes/pod-security-admission `policy/check_*.go`: non-root, no privilege escalation, capabilities
  dropped to ALL (NET_BIND_SERVICE may be added back), a RuntimeDefault or Localhost seccomp profile, no host
  namespaces, no privileged containers).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
TOTAL_ANNOTATION_BYTES = 256 * 1024
LABEL_MAX = 63
SUBDOMAIN_MAX = 253
KNATIVE_GROUP = "serving.knative.dev"

# Pod-spec fields Knative admits with the default feature flags (PodSpecMask's "Allowed fields"; the
# feature-gated ones are admitted only when the operator enabled the flag in `config-features`).
KNATIVE_POD_FIELDS = frozenset({"serviceAccountName", "containers", "volumes", "imagePullSecrets",
                                "enableServiceLinks", "automountServiceAccountToken",
                                # RevisionSpec's own fields, beside the pod spec
                                "containerConcurrency", "timeoutSeconds", "responseStartTimeoutSeconds",
                                "idleTimeoutSeconds"})
KNATIVE_FEATURE_FIELDS = {
    "affinity": "kubernetes.podspec-affinity", "topologySpreadConstraints": "kubernetes.podspec-topologyspreadconstraints",
    "hostAliases": "kubernetes.podspec-hostaliases", "nodeSelector": "kubernetes.podspec-nodeselector",
    "runtimeClassName": "kubernetes.podspec-runtimeclassname", "tolerations": "kubernetes.podspec-tolerations",
    "securityContext": "kubernetes.podspec-securitycontext",
    "shareProcessNamespace": "kubernetes.podspec-shareprocessnamespace",
    "priorityClassName": "kubernetes.podspec-priorityclassname", "schedulerName": "kubernetes.podspec-schedulername",
    "initContainers": "kubernetes.podspec-init-containers", "dnsPolicy": "kubernetes.podspec-dnspolicy",
    "dnsConfig": "kubernetes.podspec-dnsconfig", "hostIPC": "kubernetes.podspec-hostipc",
    "hostPID": "kubernetes.podspec-hostpid", "hostNetwork": "kubernetes.podspec-hostnetwork",
}
# Knative's defaults enable none of the flags above (`defaultFeaturesConfig`).
DEFAULT_KNATIVE_FEATURES: frozenset[str] = frozenset()

# Names per kind (plural, API group) -> the rule its name follows.
_LABEL_NAMED = {("namespaces", "")}
_DNS1035_NAMED = {("services", ""), ("services", KNATIVE_GROUP), ("revisions", KNATIVE_GROUP),
                  ("configurations", KNATIVE_GROUP), ("routes", KNATIVE_GROUP)}
_SHORT_NAMED = {("jobs", "batch")}  # the name is also a label value on the Job's pods


class Refused(Exception):
    """What the API server (status 422, reason Invalid) or an admission webhook (status 400) answers."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def dns1123_label(value: str) -> list[str]:
    errors = [f"must be no more than {LABEL_MAX} characters"] if len(value) > LABEL_MAX else []
    if not DNS1123_LABEL.match(value):
        errors.append("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
                      "and must start and end with an alphanumeric character")
    return errors


def dns1123_subdomain(value: str) -> list[str]:
    errors = [f"must be no more than {SUBDOMAIN_MAX} characters"] if len(value) > SUBDOMAIN_MAX else []
    if not DNS1123_SUBDOMAIN.match(value):
        errors.append("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                      "'.', and must start and end with an alphanumeric character")
    return errors


def dns1035_label(value: str) -> list[str]:
    errors = [f"must be no more than {LABEL_MAX} characters"] if len(value) > LABEL_MAX else []
    if not DNS1035_LABEL.match(value):
        errors.append("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                      "alphabetic character, and end with an alphanumeric character")
    return errors


def qualified_name(key: str) -> list[str]:
    """apimachinery's `IsLabelKey`: an optional DNS-1123 subdomain prefix and `/`, then a name of at most
    63 characters."""
    parts = key.split("/")
    if len(parts) > 2:
        return ["a valid label key must have at most one '/' (an optional DNS subdomain prefix and a name)"]
    errors: list[str] = []
    name = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errors.append("prefix part must be non-empty")
        else:
            errors += [f"prefix part {e}" for e in dns1123_subdomain(parts[0])]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > LABEL_MAX:
        errors.append(f"name part must be no more than {LABEL_MAX} characters")
    if name and not LABEL_NAME.match(name):
        errors.append("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
                      "end with an alphanumeric character")
    return errors


def label_value(value: str) -> list[str]:
    errors = [f"must be no more than {LABEL_MAX} characters"] if len(value) > LABEL_MAX else []
    if not LABEL_VALUE.match(value):
        errors.append("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                      "'.', and must start and end with an alphanumeric character")
    return errors


def labels_and_annotations(meta: Mapping[str, Any], path: str) -> list[str]:
    errors = []
    for key, value in (meta.get("labels") or {}).items():
        errors += [f"{path}.labels: Invalid value: {key!r}: {e}" for e in qualified_name(key)]
        errors += [f"{path}.labels: Invalid value: {value!r}: {e}" for e in label_value(str(value))]
    annotations = meta.get("annotations") or {}
    for key in annotations:
        errors += [f"{path}.annotations: Invalid value: {key!r}: {e}" for e in qualified_name(key.lower())]
    if sum(len(k) + len(str(v)) for k, v in annotations.items()) > TOTAL_ANNOTATION_BYTES:
        errors.append(f"{path}.annotations: Too long: must have at most {TOTAL_ANNOTATION_BYTES} bytes")
    return errors


def object_meta(plural: str, group: str, meta: Mapping[str, Any]) -> list[str]:
    """`ValidateObjectMetaAccessor` with the kind's name rule."""
    name, generate = meta.get("name") or "", meta.get("generateName") or ""
    if not name and not generate:
        return ["metadata.name: Required value: name or generateName is required"]
    rule = (dns1123_label if (plural, group) in _LABEL_NAMED else
            dns1035_label if (plural, group) in _DNS1035_NAMED else dns1123_subdomain)
    errors = []
    if name:
        errors += [f"metadata.name: Invalid value: {name!r}: {e}" for e in rule(name)]
        if (plural, group) in _SHORT_NAMED and len(name) > LABEL_MAX:
            errors.append(f"metadata.name: Invalid value: {name!r}: must be no more than {LABEL_MAX} characters")
    if generate:
        # A prefix: validated as if a 5-character suffix were added (apimachinery's `maskTrailingDash`).
        errors += [f"metadata.generateName: Invalid value: {generate!r}: {e}"
                   for e in rule(generate.rstrip("-") + "-abcde" if generate.endswith("-") else generate + "abcde")]
    return errors + labels_and_annotations(meta, "metadata")


def knative_pod_spec(spec: Mapping[str, Any], path: str, features: frozenset[str]) -> list[str]:
    refused = []
    for field in spec:
        if field in KNATIVE_POD_FIELDS:
            continue
        flag = KNATIVE_FEATURE_FIELDS.get(field)
        if flag is None or flag not in features:
            refused.append(f"{path}.{field}")
    if spec.get("automountServiceAccountToken") is True:
        refused.append(f"{path}.automountServiceAccountToken")  # only `false` may be set
    if refused:
        return [f"must not set the field(s): {', '.join(sorted(refused))}"]
    return []


def knative_service(obj: Mapping[str, Any], old: Mapping[str, Any] | None, features: frozenset[str]) -> list[str]:
    name = (obj.get("metadata") or {}).get("name") or ""
    template = (obj.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    errors = labels_and_annotations(tmeta, "spec.template.metadata")
    errors += knative_pod_spec(template.get("spec") or {}, "spec.template.spec", features)
    revision = tmeta.get("name") or ""
    if revision:
        errors += [f"spec.template.metadata.name: not a DNS 1035 label: {e}" for e in dns1035_label(revision)]
        if not revision.startswith(name + "-"):
            errors.append(f"spec.template.metadata.name: {revision!r} must have prefix {name + '-'!r}")
    if old is not None:
        before = (old.get("spec") or {}).get("template") or {}
        if revision and (before.get("metadata") or {}).get("name") == revision and _comparable(before) != _comparable(template):
            errors.append("spec.template.metadata.name: Saw the following changes without a name change (-old +new)")
    for target in (obj.get("spec") or {}).get("traffic") or []:
        if target.get("tag"):
            errors += [f"spec.traffic.tag: {e}" for e in dns1035_label(target["tag"])]
    return errors


def _comparable(template: Mapping[str, Any]) -> Any:
    return {"metadata": {k: v for k, v in (template.get("metadata") or {}).items() if k in ("name", "labels", "annotations")},
            "spec": template.get("spec") or {}}


def restricted_pod(pod: Mapping[str, Any]) -> list[str]:
    """Pod Security "restricted" (pod-security-admission `policy/check_*.go`)."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    errors = [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        sc = c.get("securityContext") or {}
        cname = c.get("name")
        if sc.get("privileged"):
            errors.append(f'privileged (container "{cname}" must not set securityContext.privileged=true)')
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f'allowPrivilegeEscalation != false (container "{cname}" must set '
                          "securityContext.allowPrivilegeEscalation=false)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            errors.append(f'unrestricted capabilities (container "{cname}" must set '
                          'securityContext.capabilities.drop=["ALL"])')
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            errors.append(f'unrestricted capabilities (container "{cname}" must not add {caps.get("add")})')
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            errors.append(f'runAsNonRoot != true (container "{cname}" must set securityContext.runAsNonRoot=true)')
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            errors.append(f'runAsUser=0 (container "{cname}" must not set runAsUser=0)')
        profile = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if profile not in ("RuntimeDefault", "Localhost"):
            errors.append(f'seccompProfile (container "{cname}" must set securityContext.seccompProfile.type to '
                          '"RuntimeDefault" or "Localhost")')
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            errors.append(f'restricted volume types (volume "{volume.get("name")}" uses hostPath)')
    return errors


def admit(plural: str, group: str, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None, *,
          namespace_labels: Mapping[str, str] | None = None,
          knative_features: frozenset[str] = DEFAULT_KNATIVE_FEATURES) -> None:
    """Raise `Refused` as the API server (or Knative's webhook) would for writing `obj` (`old`: the stored
    object an update replaces)."""
    meta = obj.get("metadata") or {}
    kind, name = obj.get("kind") or plural, meta.get("name") or meta.get("generateName") or ""
    errors = object_meta(plural, group, meta)
    if errors:
        raise Refused(422, "Invalid", f'{kind} "{name}" is invalid: ' + "; ".join(errors))
    if group == KNATIVE_GROUP and plural == "services":
        errors = knative_service(obj, old, knative_features)
        if errors:
            raise Refused(400, "BadRequest", 'admission webhook "validation.webhook.serving.knative.dev" denied the '
                          "request: validation failed: " + "; ".join(errors))
    if group == KNATIVE_GROUP and plural == "revisions" and old is not None and old.get("spec") != obj.get("spec"):
        raise Refused(400, "BadRequest", 'admission webhook "validation.webhook.serving.knative.dev" denied the '
                      "request: validation failed: Immutable fields changed (-old +new): spec")
    if plural == "pods" and group == "" and (namespace_labels or {}).get("pod-security.kubernetes.io/enforce") == "restricted":
        errors = restricted_pod(obj)
        if errors:
            raise Refused(403, "Forbidden", f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": '
                          + ", ".join(errors))


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the adapters send as `application/merge-patch+json`)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result
