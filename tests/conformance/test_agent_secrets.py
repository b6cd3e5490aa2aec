"""The agent-secret conformance suite against the recording in-memory adapter and the agents area's
implementation on its tables (an in-memory platform whose instances are the tiny test app)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from caiplatform.adapters.memory.agent_secrets import InMemoryAgentSecrets
from caiplatform.db.models import Project
from caiplatform.db.models.agents import Agent, AgentSecret
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload
from caiplatform.settings import Settings
from caiplatform.testing import sources, tiny_app
from caiplatform.testing.conformance.agent_secrets import *  # noqa: F403
from caiplatform.testing.conformance.agent_secrets import AgentWorld


def _tarball(files: dict[str, str]) -> bytes:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.fixture(params=["memory", "agents"])
async def agent_world(request):
    request.applymarker(pytest.mark.backend(request.param))
    if request.param == "memory":
        adapter = InMemoryAgentSecrets()

        async def add_memory(name: str, deployed: bool):
            return adapter.add_agent("p1", name, deployed=deployed)

        async def read_memory(ref):
            return adapter.secret_of(ref)

        yield AgentWorld(adapter, "p1", add_memory, read_memory)
        return

    platform = Platform.in_memory(Settings(CAI_AUTOMATION_TOKEN="t"))
    await platform.start()
    platform.runtime.app_factory = lambda image, env: tiny_app.create_app(env)
    service = platform.agents
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    automation = Principal.automation()

    async def add(name: str, deployed: bool):
        if deployed:
            upload = DeployUpload(fields={"name": name, "framework": "function"}, code=_tarball(sources.FUNCTION))
            await service.deploy(automation, "default", upload)
            await service.wait_idle()
        else:
            now = datetime.now(UTC)
            await platform.db.run(lambda s: s.add(Agent(project_id=project_id, name=name, kind="agent", framework="adk",
                                                         owner_email="", env={}, config={}, created_at=now, updated_at=now)))
        return await service.secret_port.find_agent(project_id, name)

    async def read(ref):
        return await platform.db.run(lambda s: {r.key: platform.db.open_secret(r.value) for r in s.scalars(select(AgentSecret).where(AgentSecret.agent_id == ref.id))})

    try:
        yield AgentWorld(service.secret_port, project_id, add, read)
    finally:
        await asyncio.wait_for(platform.aclose(), 30)
