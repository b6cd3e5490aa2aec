"""The typed contract of the serverless routes (issue 19): unknown fields are refused by name and write
nothing, the spec's messages come first, the library takes and returns models, and the health answer
is the service's own."""

from __future__ import annotations

import pytest

from caiplatform.errors import BadRequest
from caiplatform.models.serverless import (
    ServerlessHealth,
    Service,
    ServiceCreate,
    ServicePatch,
    TrafficUpdate,
    TriggerCreate,
)
from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer

from .test_services_http import IMAGE, base, create
from .test_triggers import schedule_body, triggers

pytestmark = pytest.mark.anyio


@pytest.fixture
async def http(platform, users):
    async with asgi_client(platform, ["serverless"]) as c:
        yield c, users.project_id, bearer(platform, users.member)


async def test_a_misspelled_create_field_is_refused_and_nothing_is_created(http):
    c, pid, member = http
    r = await c.post(base(pid), headers=member, json={"name": "typo", "image": IMAGE, "timeout_second": 30})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "timeout_second"'
    r = await c.post(base(pid), headers=member, json={"name": "typo", "image": IMAGE, "scaling": {"max": 3}})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "scaling.max"'
    assert (await c.get(f"{base(pid)}/typo", headers=member)).status_code == 404
    assert (await c.get(base(pid), headers=member)).json()["services"] == []


async def test_the_spec_message_wins_over_an_unknown_field(http):
    c, pid, member = http
    r = await c.post(base(pid), headers=member, json={"name": "x", "image": IMAGE, "other": 1, "timeout_seconds": 0})
    assert r.json()["error"] == "timeout_seconds must be between 1 and 3600 (got 0)"
    r = await c.post(base(pid), headers=member, json={"name": "x"})
    assert r.json()["error"].startswith("image is required - ")


async def test_a_patch_or_split_with_an_unknown_field_changes_nothing(http):
    c, pid, member = http
    svc = await create(c, pid, member, name="keep")
    r = await c.patch(f"{base(pid)}/keep", headers=member, json={"image": IMAGE, "imgae": "other"})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "imgae"'
    r = await c.post(f"{base(pid)}/keep:set-traffic", headers=member,
                     json={"traffic": [{"latest_revision": True, "percent": 100, "weight": 1}]})
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "traffic.0.weight"'
    after = (await c.get(f"{base(pid)}/keep", headers=member)).json()
    assert after["status"]["generation"] == svc["status"]["generation"]


async def test_a_trigger_with_an_unknown_field_is_refused_and_not_saved(http):
    c, pid, member = http
    await create(c, pid, member, name="target")
    body = schedule_body("t1")
    body["source"]["schedule"]["timezone"] = "UTC"
    r = await c.post(triggers(pid), headers=member, json=body)
    assert r.status_code == 400 and r.json()["error"] == 'unknown field "source.schedule.timezone"'
    assert (await c.get(triggers(pid), headers=member)).json()["triggers"] == []


async def test_the_library_takes_and_returns_models(platform, users):
    from caiplatform.models.serverless import TriggerPatch
    from caiplatform.principal import Principal

    admin = Principal.automation()
    pid = users.project_id
    svc = await platform.serverless.create(admin, pid, ServiceCreate(name="lib", image=IMAGE))
    assert isinstance(svc, Service) and svc.scaling.max_scale == 10 and svc.status.generation == 1
    patched = await platform.serverless.patch(admin, pid, "lib", ServicePatch.parse({"env": {"A": "1"}}))
    assert patched.env == {"A": "1"} and patched.status.latest_created_revision == "lib-00002"
    split = TrafficUpdate.parse({"traffic": [{"revision_name": "lib-00001", "percent": 100}]})
    assert (await platform.serverless.set_traffic(admin, pid, "lib", split)).traffic[0].revision_name == "lib-00001"
    assert [r.name for r in (await platform.serverless.revisions(admin, pid, "lib")).revisions] == ["lib-00002", "lib-00001"]
    body = schedule_body("tick")
    body["target"]["service"] = "lib"
    trigger = await platform.serverless.triggers.create(admin, pid, TriggerCreate.parse(body))
    assert trigger.state == "pending" and trigger.source.schedule is not None
    assert trigger.source.schedule.time_zone == "UTC"
    with pytest.raises(BadRequest, match="does not exist in this project"):  # the rule that needs the project
        await platform.serverless.triggers.patch(admin, pid, "tick", TriggerPatch.parse({"target": {"service": "nope"}}))
    moved = await platform.serverless.triggers.patch(admin, pid, "tick", TriggerPatch.parse({"target": {"service": "lib"}}))
    assert moved.target.service == "lib" and moved.target.path == "/"


def test_the_request_models_carry_the_spec_rules():
    with pytest.raises(BadRequest, match="traffic percentages must sum to 100"):
        ServiceCreate.parse({"name": "x", "image": IMAGE, "traffic": [{"latest_revision": True, "percent": 50}]})
    with pytest.raises(BadRequest, match="traffic is required - send the complete split"):
        TrafficUpdate.parse({"traffic": []})
    spec = ServiceCreate.parse({"name": "x", "image": IMAGE, "ports": [{"container_port": 9000}]}).spec()
    assert spec.port.name == "http1" and spec.port.container_port == 9000 and spec.timeout_seconds == 300
    assert ServicePatch.parse({"scaling": {"min_scale": 1}}).changes() == {
        "scaling": {"min_scale": 1, "max_scale": 10, "container_concurrency": 80}}


def test_a_library_caller_may_build_requests_from_the_nested_models():
    from caiplatform.models.serverless import (
        ServicePort,
        ServiceScaling,
        ServiceTrafficTarget,
        TriggerSchedule,
        TriggerSource,
        TriggerTarget,
    )

    create = ServiceCreate(name="x", image=IMAGE, ports=[ServicePort(name="h2c")], scaling=ServiceScaling(min_scale=2))
    assert create.spec().port.name == "h2c" and create.scaling.max_scale == 10
    with pytest.raises(BadRequest, match="must not be greater than"):
        ServicePatch(scaling=ServiceScaling(min_scale=20))
    split = TrafficUpdate(traffic=[ServiceTrafficTarget(latest_revision=True, percent=100)])
    assert split.traffic[0].latest_revision
    trigger = TriggerCreate(name="t", target=TriggerTarget(service="svc"),
                            source=TriggerSource(type="schedule", schedule=TriggerSchedule(cron="0 * * * *")))
    assert trigger.target.path == "/" and trigger.source.schedule and trigger.source.schedule.time_zone == "UTC"


async def test_the_health_answer_is_the_services_model(platform):
    status, health = await platform.serverless.health()
    assert status == 200 and isinstance(health, ServerlessHealth)
    assert health.status == "ok" and health.database == "ok" and health.runtime == "memory"
    assert health.kubernetes == health.crd == "not configured"
