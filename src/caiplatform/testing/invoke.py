"""Test doubles around the invoke path: a fixed `AgentDirectory` and a runtime that serves harness apps
in-process. The real ones are the agents service and the workload runtime adapters; these stand in
for them in the invoke area's tests and benchmarks."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from caiplatform.errors import Conflict, NotFound, Unauthenticated
from caiplatform.ports.runtime import Endpoint, InstanceTransport, WorkloadRef
from caiplatform.principal import Principal
from caiplatform.services.access import AUTH_REQUIRED
from caiplatform.services.agent_directory import EmbedTarget, InvokeTarget


def target_for(name: str, framework: str = "adk", *, project_short: str = "p0001",
               project_id: str | None = None) -> InvokeTarget:
    project_id = project_id or str(uuid.uuid4())
    kind = "function" if framework.startswith("function") else "agent"
    return InvokeTarget(agent=name, agent_id=str(uuid.uuid4()), project_id=project_id, project_short=project_short,
                        kind=kind, framework=framework,
                        workload=WorkloadRef(project_id, project_short, name, kind))


@dataclass
class StaticDirectory:
    """`AgentDirectory` over a fixed set of agents (anyone may invoke; any credential may manage)."""

    targets: list[InvokeTarget] = field(default_factory=list)
    embeds: dict[str, EmbedTarget] = field(default_factory=dict)

    def add(self, target: InvokeTarget) -> InvokeTarget:
        self.targets.append(target)
        return target

    def _find(self, name: str, project: str | None) -> InvokeTarget:
        found = [t for t in self.targets if t.agent == name and project in (None, t.project_id, t.project_short)]
        if not found:
            raise NotFound(f"unknown agent: {name}")
        if len(found) > 1:
            raise Conflict(f"agent {name} exists in several projects; add ?project=<slug> or sign in")
        return found[0]

    async def invoke_target(self, principal: Principal, name: str, project: str | None,
                            prefetched: Any = None) -> InvokeTarget:
        return self._find(name, project)

    async def manage_target(self, principal: Principal, name: str, project: str | None) -> InvokeTarget:
        if not principal.authenticated:
            raise Unauthenticated(AUTH_REQUIRED)
        return self._find(name, project)

    async def embed_target(self, key: str) -> EmbedTarget | None:
        return self.embeds.get(key)


AppFactory = Callable[[Mapping[str, str]], Any]


class InProcessHarnesses:
    """Serves each workload from one in-process harness app (what the in-memory runtime does), with a
    count of held slots so tests can see that every request released its own."""

    def __init__(self, app_factory: AppFactory | None = None):
        if app_factory is None:
            from caiplatform.harness.app import create_harness_app

            app_factory = create_harness_app
        self.app_factory = app_factory
        self.envs: dict[tuple[str, str], dict[str, str]] = {}
        self.apps: dict[tuple[str, str], Any] = {}
        self.tokens: dict[tuple[str, str], str] = {}
        self.held = 0
        self.acquired = 0
        self.cold_start_seconds = 0.0

    def serve(self, ref: WorkloadRef, env: Mapping[str, str]) -> None:
        self.envs[(ref.project_id, ref.name)] = dict(env)

    async def acquire(self, ref: WorkloadRef, *, timeout: float, tag: str | None = None) -> Endpoint:
        key = (ref.project_id, ref.name)
        if key not in self.envs:
            raise LookupError(ref.name)
        if key not in self.apps:
            await anyio.sleep(self.cold_start_seconds)
            # A per-instance secret, as the runtimes give their instances (the harness asks for it).
            self.tokens[key] = secrets.token_urlsafe(24)
            self.apps[key] = self.app_factory({**self.envs[key], "CAI_HARNESS_TOKEN": self.tokens[key]})
        self.held += 1
        self.acquired += 1
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.held -= 1

        transport = InstanceTransport(self.tokens[key], inner=httpx.ASGITransport(app=self.apps[key]))
        return Endpoint(revision=f"{ref.name}-00001", base_url="http://harness", release=release,
                        transport=transport, credential=transport.credential)

    async def aclose(self) -> None:
        for app in self.apps.values():
            harness = getattr(app, "harness", None)
            if harness is not None:
                await harness.aclose()
        self.apps.clear()
