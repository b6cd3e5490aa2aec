"""Erasures on PostgreSQL, where replicas share the database: two replicas racing for the same erasures
each claim a different one (never both the same), the receipt and audit entry are written once, and the
migration's table holds JSON receipts."""

from __future__ import annotations

import asyncio
import json

from sqlalchemy import select

from caiplatform.db.models import AuditEntry, Project
from caiplatform.models.erasures import ForgetRequest
from caiplatform.principal import Principal
from caiplatform.services.agents import DeployUpload
from caiplatform.services.erasures import ErasureService

from .agents_support import FUNCTION, tarball
from .test_agents_postgres import pg_platform, pg_url  # noqa: F401 - the same fixtures


async def test_two_replicas_share_the_erasures_without_running_one_twice(pg_platform):  # noqa: F811
    platform, automation = pg_platform, Principal.automation()
    await platform.agents.deploy(automation, "default", DeployUpload(fields={"name": "pg", "framework": "function"},
                                                                     code=tarball(FUNCTION)))
    await platform.agents.wait_idle()
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    one = platform.erasures
    await one.aclose()  # the rounds below are the test's own
    two = ErasureService(platform.db, platform.access, platform.clock, agents=platform.agents,
                         runtime=lambda: platform.runtime, memory=lambda: platform.invoke.memory,
                         replica_id="replica-two", shared=True)
    users = [f"user-{n}" for n in range(6)]
    made = [await one.forget(automation, project_id, ForgetRequest(user_id=u)) for u in users]
    finished = await asyncio.gather(one.run_pending(), two.run_pending())
    assert sum(finished) == len(users)
    for erasure in made:
        view = await one.get(automation, project_id, erasure.erasure_id)
        assert view.state == "done" and [(r.agent, r.store) for r in view.receipts] == [
            ("pg", "log_history"), ("pg", "memory"), ("pg", "sessions")]
    entries = await platform.db.run(lambda s: list(s.scalars(select(AuditEntry).where(AuditEntry.action == "user.forget"))))
    assert sorted(e.target for e in entries) == users  # one receipt each
    assert all(json.loads(e.detail)["totals"]["sessions"] == 0 for e in entries)


async def test_requests_at_the_same_moment_make_one_erasure(pg_platform):  # noqa: F811
    platform, automation = pg_platform, Principal.automation()
    await platform.erasures.aclose()
    project_id = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
    made = await asyncio.gather(*(platform.erasures.forget(automation, project_id, ForgetRequest(user_id="racer"))
                                  for _ in range(8)))
    assert len({e.erasure_id for e in made}) == 1
