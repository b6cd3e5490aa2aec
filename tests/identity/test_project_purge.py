"""Deleting a project removes what it holds in every area (agents must be deleted first: 409): services
with their revisions, instances and triggers (schedule, pubsub, objectstore buckets), topics with their
subscriptions, streams, consumers and push delivery, memory stores, vector indexes with their
collections, MCP servers with what serves them. Another project's resources stay. In memory here; the
areas' own directories repeat this against the real engines."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from caiplatform.db.models import McpServer, MessagingTopic, ServerlessService, ServerlessTrigger, VectorIndex
from caiplatform.ports.runtime import WorkloadRef
from caiplatform.testing.serverless import Received, echo_app_factory
from caiplatform.testing.serverless import test_images as resolve_test_images

IMAGE = "registry.local/cai-test-web@sha256:" + "c" * 64
PING = '''
from caiplatform.mcp import tool

@tool
def ping() -> str:
    """Answer pong."""
    return "pong"
'''


@dataclass
class Held:
    """Where one project's resources live in the engines (in-memory adapters here)."""

    id: str
    short: str
    namespace: str
    collection: str = ""


async def _project(client, headers, slug: str) -> Held:
    r = await client.post("/v1/projects", headers=headers, json={"slug": slug})
    assert r.status_code == 201, r.text
    project = r.json()["project"]
    return Held(project["id"], project["short"], project["namespace"])


async def _fill(client, headers, platform, held: Held) -> None:
    """One of each resource through the HTTP APIs; returns once everything is ready."""
    base = f"/v1/projects/{held.id}"
    created = [
        await client.post(f"{base}/services", headers=headers,
                          json={"name": "web", "image": IMAGE, "scaling": {"min_scale": 1}}),
        await client.post(f"{base}/topics", headers=headers, json={"name": "orders"}),
        await client.post(f"{base}/topics/orders/subscriptions", headers=headers, json={"name": "reader"}),
        await client.post(f"{base}/topics/orders/subscriptions", headers=headers, json={
            "name": "pusher", "deliver": {"mode": "push", "push": {"url": f"http://web.{held.namespace}/events"}}}),
        await client.post(f"{base}/triggers", headers=headers, json={
            "name": "nightly", "target": {"service": "web", "path": "/tick"},
            "source": {"type": "schedule", "schedule": {"cron": "0 3 * * *"}}}),
        await client.post(f"{base}/triggers", headers=headers, json={
            "name": "on-order", "target": {"service": "web", "path": "/events"},
            "source": {"type": "pubsub", "pubsub": {"topic": "orders"}}}),
        await client.post(f"{base}/triggers", headers=headers, json={
            "name": "uploads", "target": {"service": "web", "path": "/objects"},
            "source": {"type": "objectstore", "objectstore": {"bucket": "inbox"}}}),
        await client.post(f"{base}/memorystores", headers=headers, json={"name": "cache"}),
        await client.post(f"{base}/indexes", headers=headers, json={"name": "docs", "dimensions": 3}),
        await client.post(f"{base}/mcpservers", headers=headers, json={"name": "tools"}),
        await client.put(f"{base}/mcpservers/tools/tools/ping", headers=headers, json={"handler": PING}),
    ]
    assert all(r.status_code in (201, 202) for r in created), [r.text for r in created if r.status_code >= 300]
    await platform.serverless.triggers.wait_idle()
    await platform.indexes.wait_reconciled()
    await platform.mcp.wait_idle()
    triggers = (await client.get(f"{base}/triggers", headers=headers)).json()["triggers"]
    assert {t["name"]: t["state"] for t in triggers} == {"nightly": "ready", "on-order": "ready", "uploads": "ready"}
    assert (await client.get(f"{base}/mcpservers/tools", headers=headers)).json()["mcp_server"]["status"] == "ready"
    held.collection = await platform.db.run(lambda s: s.scalar(
        select(VectorIndex.collection).where(VectorIndex.project_id == held.id)))


async def _holdings(platform, held: Held) -> dict[str, object]:
    """What the engines hold for the project, resource by resource."""
    broker = platform.topics.broker
    stream = f"cai-{held.short}-orders"
    worker = platform.components["push_worker"]
    rows = await platform.db.run(lambda s: sorted(
        f"{model.__tablename__}:{name}" for model in (ServerlessService, ServerlessTrigger, MessagingTopic, VectorIndex, McpServer)
        for name in s.scalars(select(model.name).where(model.project_id == held.id))))
    return {
        "instances": (await platform.runtime.usage(held.namespace))["pods"],
        "workload": await platform.runtime.status(WorkloadRef(held.id, held.short, "web", kind="service")) is not None,
        "bucket": platform.serverless.triggers.bucket_dir(held.short, "inbox").exists(),
        "stream": await broker.stream_stats(stream) is not None,
        "consumers": [c for c in ("pusher", "reader", "trigger-on-order") if await broker.consumer_stats(stream, c)],
        "push delivery": sorted(c for s, c in worker._tasks if s == stream),
        "memorystore": await platform.memorystores.provisioner.get(held.id, "cache") is not None,
        "collection": await platform.vector_engine.collection_info(held.collection) is not None,
        "mcp served": (held.id, "tools") in platform.mcp.host.serving,
        "records": rows,
    }


EMPTY = {"instances": 0, "workload": False, "bucket": False, "stream": False, "consumers": [], "push delivery": [],
         "memorystore": False, "collection": False, "mcp served": False, "records": []}


def _serve_echo_for_test_images(platform) -> None:
    platform.runtime.app_factory = echo_app_factory(Received())
    platform.serverless.resolve_image = resolve_test_images(platform.builder)


async def test_deleting_a_project_removes_everything_it_holds(client, admin_headers, platform):
    _serve_echo_for_test_images(platform)
    doomed = await _project(client, admin_headers, "doomed")
    kept = await _project(client, admin_headers, "kept")
    for held in (doomed, kept):
        await _fill(client, admin_headers, platform, held)
    before = await _holdings(platform, doomed)
    assert before == {
        "instances": 1, "workload": True, "bucket": True, "stream": True,
        "consumers": ["pusher", "reader", "trigger-on-order"], "push delivery": ["pusher", "trigger-on-order"],
        "memorystore": True, "collection": True, "mcp served": True,
        "records": ["mcp_servers:tools", "messaging_topics:orders", "serverless_services:web",
                    "serverless_triggers:nightly", "serverless_triggers:on-order", "serverless_triggers:uploads",
                    "vector_indexes:docs"],
    }

    r = await client.delete(f"/v1/projects/{doomed.id}", headers=admin_headers)
    assert r.status_code == 200 and r.json() == {"deleted": True, "project": "doomed"}

    assert await _holdings(platform, doomed) == EMPTY
    assert await _holdings(platform, kept) == before  # the other project keeps all of its own
    # Idempotent: nothing is left to remove, and asking again does not fail.
    for area in (platform.serverless, platform.topics, platform.memorystores, platform.indexes, platform.mcp):
        assert await area.purge_project(doomed.id) == 0


async def test_each_area_purges_its_own_and_counts_what_it_removed(client, admin_headers, platform):
    _serve_echo_for_test_images(platform)
    held = await _project(client, admin_headers, "counted")
    await _fill(client, admin_headers, platform, held)
    # services + triggers, topics (their subscriptions go with them), memory stores, indexes, MCP servers
    counts = [await area.purge_project(held.id) for area in (
        platform.serverless, platform.topics, platform.memorystores, platform.indexes, platform.mcp)]
    assert counts == [1 + 3, 1, 1, 1, 1]
    assert await _holdings(platform, held) == EMPTY
    assert [await area.purge_project(held.id) for area in (
        platform.serverless, platform.topics, platform.memorystores, platform.indexes, platform.mcp)] == [0] * 5
    assert (await client.get(f"/v1/projects/{held.id}", headers=admin_headers)).status_code == 200  # the project stays


async def test_one_failing_area_does_not_keep_the_others(client, admin_headers, platform, caplog):
    _serve_echo_for_test_images(platform)
    held = await _project(client, admin_headers, "stubborn")
    await _fill(client, admin_headers, platform, held)

    async def refuse(name):
        raise ConnectionError("engine down")

    platform.vector_engine.drop_collection = refuse
    r = await client.delete(f"/v1/projects/{held.id}", headers=admin_headers)
    assert r.status_code == 200
    left = await _holdings(platform, held)
    assert left == {**EMPTY, "collection": True}  # the rest is gone; the index's collection is the leftover
    assert "removing index docs of a deleted project failed" in caplog.text


async def test_areas_never_used_are_not_built_to_delete_a_project(settings):
    from caiplatform.platform import Platform
    from caiplatform.testing.http import asgi_client, login

    platform = Platform.in_memory(settings)  # not started: every lazily built area is still unbuilt
    try:
        async with asgi_client(platform, ["core"]) as client:
            headers = await login(client)
            held = await _project(client, headers, "unused")
            assert (await client.delete(f"/v1/projects/{held.id}", headers=headers)).status_code == 200
        assert not {"serverless", "topics", "memorystores", "indexes"} & set(vars(platform))
    finally:
        await platform.aclose()
