"""Identity and tenancy values shared by the services and other areas.

- `Project.settings["quota"]`: the project's hard quota, resource name → Kubernetes quantity string;
- `Project.settings["platform_cloud"]`: the cloud-credential mapping deploys need. Absent on projects
  from before the mapping existed, a dict when mapped, `None` when explicitly unmapped (the agents
  area refuses a deploy only when the key is present and `None`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

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


# -- the views the API returns (document 2, "Resources and their fields") ------------------------------
# Optional fields are None when absent and dropped by `body()`, so "absent" in the spec is absent on the wire.


class View(BaseModel):
    model_config = ConfigDict(frozen=True)

    def body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class UserView(View):
    id: str
    email: str
    role: str
    must_change_password: bool
    org_id: str | None = None  # absent for external users
    external: bool
    created_at: str
    projects: list[str]
    agents: list[str]
    agent_count: int


class OrgView(View):
    id: str
    slug: str
    name: str
    created_at: str
    projects: int
    users: int


class OrgMemberView(View):
    user_id: str
    email: str
    role: str
    created_at: str


class ProjectView(View):
    id: str
    org_id: str
    slug: str
    name: str
    short: str
    namespace: str
    created_at: str
    your_role: str | None = None
    your_metadata_role: str | None = None


class ProjectMemberView(View):
    user_id: str
    email: str
    role: str
    kind: str  # user | service_account
    service_account_id: str | None = None
    external: bool
    created_at: str
    break_glass: bool | None = None
    expires_at: str | None = None
    reason: str | None = None
    granted_by: str | None = None
    expired: bool | None = None


class InvitationView(View):
    id: str
    email: str
    role: str
    state: str  # open | accepted | revoked | expired
    created_at: str
    expires_at: str
    accept_url: str | None = None  # on creation only
    token: str | None = None  # on creation only


class KeyView(View):
    """No field can carry a secret."""

    id: str
    key_id: str
    display_name: str
    kind: str
    created_at: str
    expires_at: str | None = None
    last_used_at: str | None = None
    revoked_at: str | None = None
    live: bool


class ServiceAccountView(View):
    id: str
    project_id: str
    name: str
    email: str
    display_name: str
    role: str | None = None
    disabled: bool
    created_at: str


class QuotaEntry(View):
    resource: str
    used: str
    hard: str
    used_pct: int
    display: str


class AuditEntryView(View):
    ts: str
    actor: str
    action: str
    target: str
    detail: str


class SearchResult(View):
    kind: str
    name: str
    project: str
    project_short: str
    route: str
    subtitle: str
