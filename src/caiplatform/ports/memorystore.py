"""The memory store provisioner port: something that runs Redis-compatible instances on request.

The provisioner owns the instance records (as a cluster owns its custom resources) and each
instance's credential (as a cluster owns the Secret `ms-<name>-credential`). It never returns a
password once stored; the service generates passwords and hands them over on create and rotate only.

Rotation contract: `rotate_password` stores the new password as pending; the previous one stays in
force until `restart` (or a platform restart, which restarts every instance) applies it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from caiplatform.domain.memorystore import Instance, InstanceSpec


@dataclass(frozen=True)
class ProvisionerHealth:
    """One health check word: `ok`, `unreachable`, `missing` or `unconfigured`, plus detail when failing."""

    status: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class MemoryStoreProvisioner(ABC):
    """Async interface every memory store backend implements."""

    #: adapter name as registered (`memory`, `local`, `kubernetes`)
    name: str = ""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Bring recorded instances back (a platform restart restarts each instance with its data)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Stop serving instances without destroying their data."""

    @abstractmethod
    def versions(self) -> list[str]:
        """Server versions this provisioner can run; the first is the platform default."""

    @abstractmethod
    async def create(self, spec: InstanceSpec, password: str) -> Instance:
        """Record and start provisioning an instance. Raises `Conflict` if the name is taken in the project."""

    @abstractmethod
    async def get(self, project_id: str, name: str) -> Instance | None:
        """The instance as observed now, or None."""

    @abstractmethod
    async def list(self, project_id: str) -> list[Instance]:
        """Every instance of the project, sorted by name."""

    @abstractmethod
    async def delete(self, project_id: str, name: str) -> Instance | None:
        """Stop the instance and destroy its data irreversibly; the record (state `Deleting`) or None."""

    @abstractmethod
    async def rotate_password(self, project_id: str, name: str, password: str) -> Instance:
        """Store `password` as the pending credential; the previous one stays in force until restart."""

    @abstractmethod
    async def restart(self, project_id: str, name: str) -> Instance:
        """Restart the instance; a pending password takes effect; data survives only with persistence."""

    @abstractmethod
    async def info(self, project_id: str, name: str) -> str:
        """The server's raw `INFO everything` text. Raises `OSError`/`ConnectionError` when unreachable."""

    @abstractmethod
    async def health(self) -> dict[str, ProvisionerHealth]:
        """Checks for `/healthz`: `kubernetes` and `memorystore_crd` (or what stands in for them)."""
