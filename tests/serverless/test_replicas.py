"""A replica follows the services another replica accepted (`ServiceFollower`): here one in-memory
platform plays both, its runtime emptied to stand for a replica that never saw the service."""

from __future__ import annotations

from sqlalchemy import delete

from caiplatform.db.models.serverless import ServerlessService as ServiceRow
from caiplatform.services.serverless_replicas import ServiceFollower
from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer

IMAGE = "registry.local/cai-test-target@sha256:" + "c" * 64


async def test_a_follower_serves_what_another_replica_accepted_and_drops_what_it_deleted(platform, users):
    async with asgi_client(platform, ["serverless"]) as c:
        member = bearer(platform, users.member)
        created = await c.post(f"/v1/projects/{users.project_id}/services", headers=member,
                               json={"name": "echo", "image": IMAGE, "publish": {"enabled": True}})
        assert created.status_code == 202, created.text
    svc = platform.serverless
    project = await svc.project(users.member, users.project_id)
    ref = svc.ref(project, "echo")
    host = platform.hosts.host_for("echo", project.short)
    # This replica never saw it: nothing in its runtime, no routes.
    await platform.runtime.delete(ref)
    platform.hosts.unregister(host)
    assert await platform.runtime.status(ref) is None and platform.hosts.lookup(host) is None

    follower = ServiceFollower(svc)
    await follower.follow()
    status = await platform.runtime.status(ref)
    assert status is not None and [r.name for r in status.revisions] == ["echo-00001"]
    assert platform.hosts.lookup(host) is not None  # published here too
    await follower.follow()  # nothing changed: nothing applied again
    assert [r.name for r in (await platform.runtime.status(ref)).revisions] == ["echo-00001"]

    # Deleted through another replica: gone from this one's runtime and routes at the next round.
    await platform.db.run(lambda s: s.execute(delete(ServiceRow).where(ServiceRow.name == "echo")))
    await follower.follow()
    assert await platform.runtime.status(ref) is None
    assert platform.hosts.lookup(host) is None
