"""The sanitized live spec that agents (`GET /v1/agents/{name}/spec`) and serverless services
(`GET .../services/{name}/spec`) show: one rule for both documents.

Managed fields and last-applied annotations are stripped; the value of every environment variable whose
name matches the documents' pattern reads `***REDACTED***`, whether it stands as a `{name, value}` entry
or in a plain `env` map. Absolute paths in the other values (the session store the platform hands an
agent lives in the server's data directory) read as their last segment: no server path leaves the server.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from caiplatform.redaction import without_paths
from caiplatform.validation import ENV_NAME

SENSITIVE_NAME = re.compile(r"(?i)(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE)")
REDACTED = "***REDACTED***"
STRIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def sanitize_spec(node: Any) -> Any:
    """A sanitized copy of a spec document (the input is left alone)."""
    if isinstance(node, list):
        return [sanitize_spec(item) for item in node]
    if not isinstance(node, Mapping):
        return node
    name = node.get("name")
    sensitive_entry = (
        isinstance(name, str) and "value" in node and bool(ENV_NAME.match(name)) and bool(SENSITIVE_NAME.search(name))
    )
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "managedFields":
            continue
        if sensitive_entry and key == "value":
            out[key] = REDACTED
        elif key == "value" and isinstance(value, str) and isinstance(name, str):
            out[key] = without_paths(value)
        elif key == "annotations" and isinstance(value, Mapping):
            out[key] = {k: v for k, v in value.items() if k not in STRIPPED_ANNOTATIONS}
        elif key == "env" and isinstance(value, Mapping):
            out[key] = {k: REDACTED if SENSITIVE_NAME.search(str(k)) else _env_value(v) for k, v in value.items()}
        else:
            out[key] = sanitize_spec(value)
    return out


def _env_value(value: Any) -> Any:
    return without_paths(value) if isinstance(value, str) else sanitize_spec(value)


# -- the document itself: a Knative Service, as the cluster would hold it --------------------------------

def knative_template_spec(container: dict[str, Any], *, concurrency: int, timeout_seconds: int,
                          runtime_class_name: str | None, service_account_name: str | None) -> dict[str, Any]:
    """A revision template's `spec`: one container, its concurrency and timeout, the optional runtime class
    and service account."""
    spec: dict[str, Any] = {"containerConcurrency": concurrency, "timeoutSeconds": timeout_seconds,
                            "containers": [container]}
    if runtime_class_name:
        spec["runtimeClassName"] = runtime_class_name
    if service_account_name:
        spec["serviceAccountName"] = service_account_name
    return spec


def knative_service(metadata: dict[str, Any], *, revision: str, labels: dict[str, str] | None, min_scale: int,
                    max_scale: int, template_spec: dict[str, Any], traffic: list[dict[str, Any]],
                    status: dict[str, Any]) -> dict[str, Any]:
    """The Knative Service document both the agents' and the serverless services' `spec` routes show (the
    runtime's view of a workload, `adapters/instances.py`; the serverless area's accepted spec,
    `services/serverless.py`): `labels` None leaves the template without a `labels` field."""
    template_metadata: dict[str, Any] = {"name": revision}
    if labels is not None:
        template_metadata["labels"] = labels
    template_metadata["annotations"] = {
        "autoscaling.knative.dev/min-scale": str(min_scale),
        "autoscaling.knative.dev/max-scale": str(max_scale),
    }
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {"template": {"metadata": template_metadata, "spec": template_spec}, "traffic": traffic},
        "status": status,
    }
