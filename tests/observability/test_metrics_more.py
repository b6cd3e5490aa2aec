"""The metrics read at scrape time, sampled in the background or set by /healthz: warm sandbox pools, the
subscriptions' backlog and the engines' health."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from caiplatform.metrics import Metrics

pytestmark = pytest.mark.unit


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.exposition().decode()) for s in family.samples}


class Pool:
    observe_wait = None

    def describe(self) -> dict:
        return {"size": 3, "warm": 2, "starting": 1, "running": 0, "served": 7, "refused": 1, "failed_starts": 0}


def test_a_warm_pool_is_read_at_scrape_time_and_its_waits_observed():
    metrics, pool = Metrics(), Pool()
    metrics.pool("code", pool)
    pool.observe_wait(0.2)  # what BasePool.acquire calls
    got = samples(metrics)
    assert got[("cai_sandbox_pool_size", (("pool", "code"),))] == 3
    assert got[("cai_sandbox_pool_sandboxes", (("pool", "code"), ("state", "warm")))] == 2
    assert got[("cai_sandbox_pool_sandboxes", (("pool", "code"), ("state", "starting")))] == 1
    assert got[("cai_sandbox_pool_served_total", (("pool", "code"),))] == 7
    assert got[("cai_sandbox_pool_refused_total", (("pool", "code"),))] == 1
    assert got[("cai_sandbox_pool_wait_seconds_count", (("pool", "code"),))] == 1
    assert got[("cai_sandbox_pool_wait_seconds_sum", (("pool", "code"),))] == pytest.approx(0.2)


async def test_the_code_sandbox_pool_reports_its_waits(platform):
    pool = platform.code_sandbox.pool
    assert pool.observe_wait is not None
    assert ("cai_sandbox_pool_size", (("pool", "code"),)) in samples(platform.metrics)


async def test_healthz_sets_each_dependencys_state(client, platform):
    assert (await client.get("/healthz")).status_code == 200
    got = samples(platform.metrics)
    up = {labels: value for (name, labels), value in got.items() if name == "cai_engine_up"}
    assert up[(("api", "core"), ("check", "database"))] == 1
    assert up[(("api", "pubsub"), ("check", "broker"))] == 1
    assert up[(("api", "vectordb"), ("check", "vector_store"))] == 1
    assert (("api", "serverless"), ("check", "kubernetes")) not in up  # "not configured" is not a state


def test_a_failing_check_is_zero():
    metrics = Metrics()
    metrics.observe_health("vectordb", {"status": "degraded", "dependencies": {
        "vector_store": {"ok": False, "error": "refused"}, "database": {"ok": True}}})
    metrics.observe_health("core", {"status": "degraded", "database": "unreachable"})
    got = samples(metrics)
    assert got[("cai_engine_up", (("api", "vectordb"), ("check", "vector_store")))] == 0
    assert got[("cai_engine_up", (("api", "vectordb"), ("check", "database")))] == 1
    assert got[("cai_engine_up", (("api", "core"), ("check", "database")))] == 0


async def test_a_subscriptions_backlog_is_sampled_off_the_scrape(client, admin_headers, platform, monkeypatch):
    from sqlalchemy import select

    from caiplatform.db.models import Project

    sampler = platform.components["backlog_sampler"]
    broker = platform.topics.broker
    asked: list[str] = []
    stats = broker.consumer_stats

    async def counted(stream, consumer):
        asked.append(consumer)
        return await stats(stream, consumer)

    monkeypatch.setattr(broker, "consumer_stats", counted)
    await sampler.round()  # no subscription: one read of the database, no broker call, no series
    assert asked == [] and not [k for k in samples(platform.metrics) if k[0] == "cai_subscription_backlog"]

    project = (await client.get("/v1/projects", headers=admin_headers)).json()["projects"][0]["id"]
    short = await platform.db.run(lambda s: s.scalar(select(Project.short).where(Project.id == project)))
    topics = f"/v1/projects/{project}/topics"
    assert (await client.post(topics, headers=admin_headers, json={"name": "lag"})).status_code == 201
    r = await client.post(f"{topics}/lag/subscriptions", headers=admin_headers, json={"name": "slow"})
    assert r.status_code == 201, r.text
    r = await client.post(f"{topics}/lag:publish", headers=admin_headers,
                          json={"messages": [{"text": str(i)} for i in range(5)]})
    assert r.status_code == 200, r.text
    key = (("project", short), ("subscription", "slow"), ("topic", "lag"))
    assert ("cai_subscription_backlog", key) not in samples(platform.metrics)  # not before a round
    await sampler.round()
    got = samples(platform.metrics)
    assert got[("cai_subscription_backlog", key)] == 5
    assert got[("cai_subscription_unacknowledged", key)] == 0

    pulled = await client.post(f"{topics}/lag/subscriptions/slow:pull", headers=admin_headers, json={"max_messages": 2})
    assert pulled.status_code == 200, pulled.text
    scraped = asked[:]
    samples(platform.metrics)
    assert asked == scraped  # a scrape never asks the broker
    await sampler.round()
    got = samples(platform.metrics)
    assert (got[("cai_subscription_backlog", key)], got[("cai_subscription_unacknowledged", key)]) == (5, 2)

    r = await client.delete(f"{topics}/lag/subscriptions/slow", headers=admin_headers)
    assert r.status_code in (200, 202, 204), r.text
    await sampler.round()  # a subscription gone is gone from the gauge
    assert ("cai_subscription_backlog", key) not in samples(platform.metrics)
