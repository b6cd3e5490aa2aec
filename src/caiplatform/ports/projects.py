"""Project provisioning port: what a new project gets outside the relational record.

Creating a project (document 2) provisions, in this order: a namespace, its resource quota, a network
policy, a model credential and a cache access user. Every step is non-fatal: a failing step is reported
in the create response's `warning` and the project still exists, so an operator can repair it later
(for the cache user, `POST /v1/admin/valkey-acl/backfill` re-runs that step for every project).

Adapters: `memory` (records calls in process), `local` (the one-machine default: records what it did
under `<data-dir>/projects/<short>/provisioning.json`), `kubernetes` (namespace, ResourceQuota, LimitRange,
NetworkPolicy on a cluster; docs/kubernetes.md).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

#: Steps in the order `provision` runs them.
PROVISION_STEPS: tuple[str, ...] = ("namespace", "quota", "network_policy", "model_credential", "cache_access_user")


@dataclass(frozen=True)
class ProjectSpec:
    """What a provisioner needs to know about a project."""

    id: str
    slug: str
    short: str
    org_id: str
    quota: dict[str, str] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return f"cai-p-{self.short}"


@dataclass
class ProvisionReport:
    """Which steps succeeded and why the others failed (`failed[step] = message`)."""

    done: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def warning(self) -> str | None:
        if not self.failed:
            return None
        parts = [f"{step}: {message}" for step, message in self.failed.items()]
        return "project created, but some provisioning steps failed (" + "; ".join(parts) + ")"


class ProjectProvisioner(abc.ABC):
    """Each method is idempotent: running a step twice leaves the same state as running it once."""

    @abc.abstractmethod
    async def namespace(self, project: ProjectSpec) -> None: ...

    @abc.abstractmethod
    async def quota(self, project: ProjectSpec) -> None: ...

    @abc.abstractmethod
    async def network_policy(self, project: ProjectSpec) -> None: ...

    @abc.abstractmethod
    async def model_credential(self, project: ProjectSpec) -> None: ...

    @abc.abstractmethod
    async def cache_access_user(self, project: ProjectSpec) -> None: ...

    @abc.abstractmethod
    async def deprovision(self, project: ProjectSpec) -> None:
        """Remove everything the steps created. Idempotent; unknown projects are a no-op."""

    @abc.abstractmethod
    async def provisioned(self, project: ProjectSpec) -> list[str]:
        """The steps recorded as done for this project, in `PROVISION_STEPS` order."""

    async def provision(self, project: ProjectSpec) -> ProvisionReport:
        """Run every step; a failure is recorded and the next step still runs."""
        report = ProvisionReport()
        for step in PROVISION_STEPS:
            try:
                await getattr(self, step)(project)
            except Exception as exc:  # noqa: BLE001 - every step is non-fatal by specification
                report.failed[step] = str(exc) or type(exc).__name__
            else:
                report.done.append(step)
        return report

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients; the default has nothing to release."""
