"""A deploy accepted just before the server stops is finished by the next start on the same data dir."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from caiplatform.db.models.agents import AgentBuild
from caiplatform.platform import Platform
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload
from caiplatform.settings import Settings

from .agents_support import FUNCTION, tarball


async def test_a_build_cut_short_by_a_stop_resumes_on_start(tmp_path):
    settings = Settings(CAI_AUTOMATION_TOKEN="t", CAI_SCALE_TO_ZERO_SECONDS=30)
    automation = Principal.automation()
    first = Platform.embedded(tmp_path / "data", settings)
    await first.start()
    try:
        upload = DeployUpload(fields={"name": "survivor", "framework": "function"}, code=tarball(FUNCTION))
        accepted = await first.agents.deploy(automation, "default", upload)
        assert (await first.agents.get(automation, "survivor", None)).state == "building"
    finally:
        await first.aclose()  # stops mid-build: the background build is cancelled

    second = Platform.embedded(tmp_path / "data", settings)
    await second.start()
    try:
        for _ in range(600):
            view = await second.agents.get(automation, "survivor", None)
            if view.state not in ("building", "deploying"):
                break
            await asyncio.sleep(0.1)
        assert view.ready, view
        assert view.latest_revision == "survivor-00001"
        builds = await second.db.run(lambda s: [(b.id, b.state) for b in s.scalars(select(AgentBuild))])
        assert builds == [(accepted.build_id, "succeeded")]
    finally:
        await second.aclose()
