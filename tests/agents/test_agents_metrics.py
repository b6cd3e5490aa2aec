"""/metrics after deploys and invokes in memory: builds, cold starts, instances, invokes by outcome."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from .agents_support import FUNCTION, GRAPH, deploy, wait_settled

pytestmark = pytest.mark.unit


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(scrape: dict, name: str, **labels: str) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_builds_starts_instances_and_invokes_are_exported(client, world):
    assert (await deploy(client, world.member, "fn", FUNCTION, framework="function")).status_code == 202
    assert (await wait_settled(client, world.member, "fn"))["ready"]
    # no framework: adk, whose entry file is missing: the build fails
    assert (await deploy(client, world.member, "plain", GRAPH)).status_code == 202
    assert (await wait_settled(client, world.member, "plain"))["state"] == "failed"
    # the tiny test app has no /invoke: the agent is reached and answers an error
    r = await client.post("/v1/agents/fn/invoke", headers=world.member, json={"message": "hi"})
    assert r.status_code >= 500, r.text

    r = await client.get("/metrics", headers=world.automation)
    assert r.status_code == 200, r.text
    scrape = samples(r.text)
    project = world.project_short
    assert value(scrape, "cai_builds_total", outcome="succeeded") == 1
    assert value(scrape, "cai_builds_total", outcome="failed") == 1
    assert value(scrape, "cai_build_duration_seconds_count") == 2
    assert value(scrape, "cai_agent_cold_starts_total", project=project, agent="fn") == 1
    assert value(scrape, "cai_instance_start_duration_seconds_count") == 1
    assert value(scrape, "cai_agent_instances", project=project, agent="fn") == 1
    assert value(scrape, "cai_agent_invokes_total", project=project, agent="fn", outcome="error") == 1
    assert value(scrape, "cai_agent_invoke_duration_seconds_count", project=project, agent="fn") == 1
    assert value(scrape, "cai_http_requests_total", method="POST", route="/v1/agents/{name}/invoke",
                 status_class="5xx") == 1
    assert value(scrape, "cai_http_requests_total", method="POST", route="/v1/agents", status_class="2xx") == 2
    assert "/v1/agents/fn" not in r.text
