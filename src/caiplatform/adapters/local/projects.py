"""The one-machine project provisioner.

On one machine there is no cluster to create namespaces in: workloads run as local processes, the quota
is enforced from the project's settings by the platform itself, and the loopback needs no network
policy. What this adapter does is keep a durable record of each step, per project, under
`<data-dir>/projects/<short>/provisioning.json` (the namespace, the quota it applied, a generated cache
access user name), so that a restart knows what exists and `deprovision` knows what to remove.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import anyio

from caiplatform.clock import Clock, rfc3339
from caiplatform.ports.projects import PROVISION_STEPS, ProjectProvisioner, ProjectSpec


class LocalProjectProvisioner(ProjectProvisioner):
    def __init__(self, data_dir: str | Path, *, clock: Clock | None = None, **_: object):
        self.root = Path(data_dir) / "projects"
        self.clock = clock or Clock()

    def _file(self, project: ProjectSpec) -> Path:
        return self.root / project.short / "provisioning.json"

    def _read(self, project: ProjectSpec) -> dict[str, Any]:
        path = self._file(project)
        if not path.exists():
            return {"project_id": project.id, "namespace": project.namespace, "steps": {}}
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def _record_sync(self, project: ProjectSpec, step: str, detail: dict[str, Any]) -> None:
        path = self._file(project)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self._read(project)
        data["steps"][step] = {"at": rfc3339(self.clock.now()), **detail}
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)  # atomic, so a crash never leaves half a record

    async def _record(self, project: ProjectSpec, step: str, **detail: Any) -> None:
        await anyio.to_thread.run_sync(self._record_sync, project, step, detail)

    async def namespace(self, project: ProjectSpec) -> None:
        await self._record(project, "namespace", name=project.namespace)

    async def quota(self, project: ProjectSpec) -> None:
        await self._record(project, "quota", hard=dict(project.quota))

    async def network_policy(self, project: ProjectSpec) -> None:
        await self._record(project, "network_policy", policy="loopback-only")

    async def model_credential(self, project: ProjectSpec) -> None:
        await self._record(project, "model_credential", source="platform model key")

    async def cache_access_user(self, project: ProjectSpec) -> None:
        await self._record(project, "cache_access_user", user=f"cai-p-{project.short}")

    async def deprovision(self, project: ProjectSpec) -> None:
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(self.root / project.short, ignore_errors=True))

    async def provisioned(self, project: ProjectSpec) -> list[str]:
        data = await anyio.to_thread.run_sync(self._read, project)
        return [step for step in PROVISION_STEPS if step in data["steps"]]
