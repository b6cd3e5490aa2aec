"""A replica follows the agents another replica rolled out (`AgentFollower`): here one in-memory platform
plays both, its runtime and builder emptied to stand for a replica that never saw the agent."""

from __future__ import annotations

from sqlalchemy import delete

from caiplatform.db.models import Agent
from caiplatform.principal import Principal
from caiplatform.services.agent_replicas import AgentFollower
from caiplatform.services.agents import DeployUpload

from .agents_support import FUNCTION, tarball


async def test_a_follower_builds_and_serves_what_another_replica_rolled_out(platform, world):
    agents = platform.agents
    await agents.deploy(Principal.automation(), "default", DeployUpload(
        fields={"name": "fn", "framework": "function"}, code=tarball(FUNCTION)))
    await agents.wait_idle()
    record = await agents._record_by_id((await agents.invoke_target(Principal.anonymous(), "fn", None)).agent_id)
    assert record is not None and record.state == "ready"
    generation = record.generation
    # This replica never saw it: its runtime has no revision, its builder no image.
    await platform.runtime.delete(record.workload)
    await platform.builder.remove(record.image)
    assert await platform.builder.resolve(record.image) is None

    follower = AgentFollower(agents)
    await follower.follow()
    status = await platform.runtime.status(record.workload)
    assert status is not None and [r.name for r in status.revisions] == [record.latest_revision]
    assert await platform.builder.resolve(record.image) is not None  # built here from the stored sources
    after = await agents._record_by_id(record.id)
    assert after is not None and after.generation == generation and after.state == "ready"  # nothing written

    # Deleted through another replica: gone from this one's runtime at the next round.
    await platform.db.run(lambda s: s.execute(delete(Agent).where(Agent.id == record.id)))
    await follower.follow()
    assert await platform.runtime.status(record.workload) is None
