"""Each delivery of a trigger to its target: `cai_trigger_firings_total{project,kind,outcome}`, and while
tracing is on a trace of its own (a PRODUCER `trigger <name>` span) whose traceparent the target gets."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from caiplatform import tracing
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


async def test_a_firing_is_a_trace_the_target_continues(platform, users, clock, received):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    exporter, provider = InMemorySpanExporter(), TracerProvider(sampler=tracing.traces_start_at_work(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.activate(provider)
    try:
        async with asgi_client(platform, ["serverless"]) as c:
            pid, member = users.project_id, bearer(platform, users.member)
            r = await c.post(f"/v1/projects/{pid}/services", headers=member, json={"name": "target", "image": IMAGE})
            assert r.status_code == 202, r.text
            body = {"name": "tick", "target": {"service": "target", "path": "/tick"},
                    "source": {"type": "schedule", "schedule": {"cron": "* * * * *"}}}
            assert (await c.post(f"/v1/projects/{pid}/triggers", headers=member, json=body)).status_code == 202
            await platform.serverless.triggers.wait_idle()
            clock.advance(timedelta(minutes=1).total_seconds())
            assert await platform.serverless.triggers.run_due() == 1
    finally:
        tracing.deactivate()
    (request,) = received.requests
    _, trace_id, parent_id, _ = request["headers"]["traceparent"].split("-")
    (firing,) = [s for s in exporter.get_finished_spans() if s.name == "trigger tick"]
    assert firing.kind.name == "PRODUCER" and firing.parent is None
    assert (f"{firing.context.trace_id:032x}", f"{firing.context.span_id:016x}") == (trace_id, parent_id)
    assert firing.attributes["caiplatform.trigger.kind"] == "schedule"
    provider.shutdown()
