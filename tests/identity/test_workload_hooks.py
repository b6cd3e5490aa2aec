"""The identity views over the workload areas, as the platform wires them: search finds agents, functions
and services; quota's "used" is the runtime's; the user view
names the agents a user deployed."""

from __future__ import annotations

from tests.agents.agents_support import FUNCTION, deploy, wait_settled


async def _default_project(client, headers) -> dict:
    projects = (await client.get("/v1/projects", headers=headers)).json()["projects"]
    return next(p for p in projects if p["slug"] == "default")


async def test_search_quota_and_user_view_see_the_workloads(client, admin_headers, platform):
    assert (await deploy(client, admin_headers, "finder-fn", FUNCTION, framework="function")).status_code == 202
    assert (await wait_settled(client, admin_headers, "finder-fn"))["state"] == "ready"
    project = await _default_project(client, admin_headers)
    created = await client.post(
        f"/v1/projects/{project['id']}/services", headers=admin_headers,
        json={"name": "finder-svc", "image": "registry.local/cai-x-finder@sha256:" + "0" * 64},
    )
    assert created.status_code == 202

    results = (await client.get("/v1/search", params={"q": "finder"}, headers=admin_headers)).json()["results"]
    found = {(r["kind"], r["name"]) for r in results}
    assert {("function", "finder-fn"), ("service", "finder-svc")} <= found
    assert ("agent", "finder-fn") not in found

    await client.post("/v1/agents/finder-fn/invoke", json={"hello": "world"})  # an instance runs now
    quota = (await client.get(f"/v1/projects/{project['id']}/quota", headers=admin_headers)).json()
    used = {q["resource"]: q["used"] for q in quota["quotas"]}
    runtime_usage = await platform.runtime.usage(project["namespace"])
    assert int(used["services"]) == runtime_usage["services"] > 0

    users = (await client.get("/v1/users", headers=admin_headers)).json()["users"]
    admin = next(u for u in users if u["email"] == "admin@example.com")
    assert "finder-fn" in admin["agents"] and admin["agent_count"] == len(admin["agents"])
