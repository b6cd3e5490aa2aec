"""`cai_trigger_firings_total{project,kind,outcome}`: each delivery of a trigger to its target."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer, project_users

IMAGE = "registry.local/cai-test-target@sha256:" + "b" * 64


def firings(platform) -> dict[tuple[str, str, str], float]:
    text = platform.metrics.exposition().decode()
    return {(s.labels["project"], s.labels["kind"], s.labels["outcome"]): s.value
            for family in text_string_to_metric_families(text) if family.name == "cai_trigger_firings"
            for s in family.samples if s.name == "cai_trigger_firings_total"}


async def test_firings_are_counted_by_project_kind_and_outcome(platform, users, clock, received):
    async with asgi_client(platform, ["serverless"]) as c:
        pid, member = users.project_id, bearer(platform, users.member)
        for service in ("target", "gone"):
            r = await c.post(f"/v1/projects/{pid}/services", headers=member, json={"name": service, "image": IMAGE})
            assert r.status_code == 202, r.text
        for name, service in (("tick", "target"), ("lost", "gone")):
            body = {"name": name, "target": {"service": service, "path": "/tick"},
                    "source": {"type": "schedule", "schedule": {"cron": "* * * * *"}}}
            assert (await c.post(f"/v1/projects/{pid}/triggers", headers=member, json=body)).status_code == 202
        await platform.serverless.triggers.wait_idle()
        admin = bearer(platform, (await project_users(platform, prefix="adm")).admin)
        assert (await c.delete(f"/v1/projects/{pid}/services/gone", headers=admin)).status_code == 204
        clock.advance(timedelta(minutes=1).total_seconds())
        assert await platform.serverless.triggers.run_due() == 2
        short = (await c.get(f"/v1/projects/{pid}/triggers/tick", headers=member)).json()["project"].split("/")[1]
    assert firings(platform) == {(short, "schedule", "ok"): 1.0, (short, "schedule", "error"): 1.0}
