"""In-memory project provisioner: records every step per project, for tests and `Platform.in_memory()`."""

from __future__ import annotations

from caiplatform.ports.projects import PROVISION_STEPS, ProjectProvisioner, ProjectSpec


class InMemoryProjectProvisioner(ProjectProvisioner):
    def __init__(self, *, fail: dict[str, str] | None = None, **_: object):
        self.steps: dict[str, set[str]] = {}
        # Steps to fail on purpose (step → message), so tests can see a non-fatal failure surface.
        self.fail = dict(fail or {})

    def _do(self, step: str, project: ProjectSpec) -> None:
        if step in self.fail:
            raise RuntimeError(self.fail[step])
        self.steps.setdefault(project.id, set()).add(step)

    async def namespace(self, project: ProjectSpec) -> None:
        self._do("namespace", project)

    async def quota(self, project: ProjectSpec) -> None:
        self._do("quota", project)

    async def network_policy(self, project: ProjectSpec) -> None:
        self._do("network_policy", project)

    async def model_credential(self, project: ProjectSpec) -> None:
        self._do("model_credential", project)

    async def cache_access_user(self, project: ProjectSpec) -> None:
        self._do("cache_access_user", project)

    async def deprovision(self, project: ProjectSpec) -> None:
        self.steps.pop(project.id, None)

    async def provisioned(self, project: ProjectSpec) -> list[str]:
        done = self.steps.get(project.id, set())
        return [step for step in PROVISION_STEPS if step in done]
