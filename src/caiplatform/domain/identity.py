"""Identity and tenancy values shared by the services and other areas.

- `Project.settings["quota"]`: the project's hard quota, resource name → Kubernetes quantity string;
- `Project.settings["platform_cloud"]`: the cloud-credential mapping deploys need. Absent on projects
  from before the mapping existed, a dict when mapped, `None` when explicitly unmapped (the agents
  area refuses a deploy only when the key is present and `None`).
"""

from __future__ import annotations

from typing import Any

# Document 2, Limits: default project quotas (0 hard means unlimited).
DEFAULT_QUOTA: dict[str, str] = {
    "pods": "50",
    "services": "30",
    "requests.cpu": "10",
    "requests.memory": "20Gi",
    "limits.cpu": "20",
    "limits.memory": "40Gi",
}
# "A fallback of 60 services applies only when a project is created without the field": a project
# whose record carries no quota settings at all (the bootstrap default project, older records).
FALLBACK_QUOTA: dict[str, str] = {**DEFAULT_QUOTA, "services": "60"}

QUOTA_LABELS: dict[str, str] = {
    "pods": "Running instances",
    "services": "Services",
    "requests.cpu": "CPU (reserved)",
    "requests.memory": "Memory (reserved)",
    "limits.cpu": "CPU (max)",
    "limits.memory": "Memory (max)",
    "count/deployments.apps": "Workloads",
    "persistentvolumeclaims": "Storage volumes",
}

PLATFORM_CLOUD_KEY = "platform_cloud"
QUOTA_KEY = "quota"
MODEL_KEY_SETTING = "model_api_key"


def default_cloud_mapping() -> dict[str, Any]:
    """The one-machine mapping every new project gets, so deploys work out of the box: the local
    builder and registry need no cloud credential."""
    return {"provider": "local", "credential": "", "registry": "local", "default": True}

# The views the API returns (document 2, "Resources and their fields") are the models of
# `caiplatform.models.accounts` and `caiplatform.models.projects`.
