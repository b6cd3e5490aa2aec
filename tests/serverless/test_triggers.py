"""Triggers: CRUD over HTTP, the schedule fired by the injectable clock, pub/sub through a push
subscription delivered to the service's private hostname."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
import pytest

from caiplatform.ports.runtime import WorkloadRef
from caiplatform.principal import Principal
from caiplatform.services.serverless_triggers import TriggerService
from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer, project_users

IMAGE = "registry.local/cai-test-target@sha256:" + "b" * 64
AUTOMATION = Principal.automation()


@pytest.fixture
async def http(platform, users):
    async with asgi_client(platform, ["serverless"]) as c:
        yield c, users.project_id, bearer(platform, users.member)


def triggers(pid: str) -> str:
    return f"/v1/projects/{pid}/triggers"


def schedule_body(name: str, cron: str = "*/5 * * * *", **schedule) -> dict:
    return {"name": name, "target": {"service": "target", "path": "/tick"},
            "source": {"type": "schedule", "schedule": {"cron": cron, **schedule}}}


async def make_target(c, pid, member, name: str = "target") -> None:
    r = await c.post(f"/v1/projects/{pid}/services", headers=member, json={"name": name, "image": IMAGE})
    assert r.status_code == 202, r.text


async def test_trigger_crud_and_validation(http, platform):
    c, pid, member = http
    await make_target(c, pid, member)
    r = await c.post(triggers(pid), headers=member, json=schedule_body("nightly", payload='{"message": "hi"}'))
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["state"] == "pending" and created["ready"] is False
    assert created["target"] == {"service": "target", "path": "/tick"}
    assert created["source"] == {"type": "schedule", "schedule": {"cron": "*/5 * * * *", "time_zone": "UTC",
                                                                  "payload": '{"message": "hi"}'}}
    assert created["delivery_url"].startswith("http://target.cai-p-") and created["delivery_url"].endswith("/tick")
    await platform.serverless.triggers.wait_idle()
    got = (await c.get(f"{triggers(pid)}/nightly", headers=member)).json()
    assert got["state"] == "ready" and got["ready"] is True and got["runs"] == []

    again = await c.post(triggers(pid), headers=member, json=schedule_body("nightly"))
    assert again.status_code == 409 and again.json()["error"] == "a trigger with that name already exists in this project"

    bad = [
        (schedule_body("Bad Name"), "name must be 1 to 63 characters"),
        ({**schedule_body("t1"), "target": {"service": "ghost"}}, "target.service 'ghost' does not exist"),
        ({**schedule_body("t1"), "target": {"service": "target", "path": "tick"}}, "target.path must be a path"),
        (schedule_body("t1", cron="* * * *"), "source.schedule.cron must have five fields"),
        (schedule_body("t1", cron="61 * * * *"), "source.schedule.cron must have five fields"),
        (schedule_body("t1", time_zone="Mars/Olympus"), "is not a known IANA time zone"),
        ({**schedule_body("t1"), "source": {"type": "webhook"}}, "source.type must be one of"),
        ({**schedule_body("t1"), "source": {"type": "objectstore", "objectstore": {"bucket": "../etc"}}},
         "source.objectstore.bucket must be a bucket name"),
        ({**schedule_body("t1"), "source": {"type": "objectstore"}}, "source.objectstore is required"),
        ({**schedule_body("t1"), "source": {"type": "pubsub", "pubsub": {}}}, "source.pubsub.topic is required"),
    ]
    for body, message in bad:
        r = await c.post(triggers(pid), headers=member, json=body)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)

    for name in ("a-one", "a-two"):
        assert (await c.post(triggers(pid), headers=member, json=schedule_body(name))).status_code == 202
    first = (await c.get(triggers(pid), headers=member, params={"page_size": 2})).json()
    assert [t["name"] for t in first["triggers"]] == ["a-one", "a-two"] and first["next_page_token"]
    last = (await c.get(triggers(pid), headers=member,
                        params={"page_size": 2, "page_token": first["next_page_token"]})).json()
    assert [t["name"] for t in last["triggers"]] == ["nightly"] and "next_page_token" not in last

    patched = await c.patch(f"{triggers(pid)}/nightly", headers=member,
                            json={"source": {"type": "schedule", "schedule": {"cron": "0 * * * *"}}})
    assert patched.status_code == 200 and patched.json()["source"]["schedule"]["cron"] == "0 * * * *"
    assert patched.json()["target"] == {"service": "target", "path": "/tick"}  # kept
    assert (await c.patch(f"{triggers(pid)}/nightly", headers=member,
                          json={"target": {"service": "ghost"}})).status_code == 400

    assert (await c.delete(f"{triggers(pid)}/nightly", headers=member)).status_code == 204
    assert (await c.get(f"{triggers(pid)}/nightly", headers=member)).status_code == 404
    assert (await c.delete(f"{triggers(pid)}/nightly", headers=member)).status_code == 404
    assert (await c.get(triggers(pid))).status_code == 401


async def test_a_schedule_fires_on_time_with_the_payload_verbatim(http, platform, clock, received):
    c, pid, member = http
    await make_target(c, pid, member)
    payload = '{"message":  "tick",\n "n": 1}'
    r = await c.post(triggers(pid), headers=member, json=schedule_body("every5", payload=payload))
    assert r.status_code == 202
    await platform.serverless.triggers.wait_idle()
    scheduler = platform.serverless.triggers

    clock.advance(minutes=4, seconds=59)
    assert await scheduler.run_due() == 0
    clock.advance(seconds=1)  # 00:05:00
    assert await scheduler.run_due() == 1
    assert await scheduler.run_due() == 0  # an occurrence fires once
    (request,) = received.requests
    assert request["path"] == "/tick" and request["method"] == "POST" and request["body"] == payload
    assert request["headers"]["content-type"] == "application/json"

    clock.advance(minutes=10)  # 00:15: the 00:10 and 00:15 occurrences are due; a cron job runs the newest
    assert await scheduler.run_due() == 1
    got = (await c.get(f"{triggers(pid)}/every5", headers=member)).json()
    assert [run["occurrence"] for run in got["runs"]] == ["2026-01-01T00:15:00Z", "2026-01-01T00:05:00Z"]
    assert all(run["status"] == "succeeded" and run["http_status"] == 200 for run in got["runs"])


async def test_the_schedule_follows_its_time_zone(http, platform, clock, received):
    c, pid, member = http
    await make_target(c, pid, member)
    # 09:00 in Paris is 08:00 UTC in January.
    assert (await c.post(triggers(pid), headers=member,
                         json=schedule_body("paris", cron="0 9 * * *", time_zone="Europe/Paris"))).status_code == 202
    await platform.serverless.triggers.wait_idle()
    clock.advance(hours=7, minutes=59)
    assert await platform.serverless.triggers.run_due() == 0
    clock.advance(minutes=1)
    assert await platform.serverless.triggers.run_due() == 1 and len(received.requests) == 1


async def test_several_replicas_on_one_database_fire_each_occurrence_once(tmp_path, clock):
    """Two servers (each its own connection pool) share one database file; the run row is the claim."""
    from sqlalchemy import func, select

    from caiplatform.db import Database
    from caiplatform.db.models import Org, Project
    from caiplatform.db.models.serverless import ServerlessTrigger, ServerlessTriggerRun
    from caiplatform.pagination import Pager
    from caiplatform.services.audit import AuditLog

    path = tmp_path / "shared.db"
    first, second = Database.sqlite_file(path), Database.sqlite_file(path)
    first.migrate()
    now = clock.now()

    def seed(session):
        org = Org(slug="o", name="o", created_at=now)
        session.add(org)
        session.flush()
        project = Project(org_id=org.id, slug="p", name="p", short="abc123", created_at=now)
        session.add(project)
        session.flush()
        session.add(ServerlessTrigger(
            project_id=project.id, name="every-minute", target={"service": "gone", "path": "/"},
            source={"type": "schedule", "schedule": {"cron": "* * * * *", "time_zone": "UTC", "payload": ""}},
            state="ready", message="", schedule_from=now, created_at=now, updated_at=now))

    first.run_sync(seed)
    replicas = [TriggerService(db, AuditLog(clock), clock, Pager(b"k"), runtime=None, project=None)  # type: ignore[arg-type]
                for db in (first, second, first, second)]
    try:
        clock.advance(minutes=1)
        fired = await asyncio.gather(*(r.run_due() for r in replicas))
        assert sum(fired) == 1
        clock.advance(minutes=2)  # two occurrences missed: the newest fires, once
        fired = await asyncio.gather(*(r.run_due() for r in replicas))
        assert sum(fired) == 1
        runs = first.run_sync(lambda s: s.scalar(select(func.count()).select_from(ServerlessTriggerRun)))
        assert runs == 2
    finally:
        first.dispose()
        second.dispose()


async def test_a_failing_target_is_recorded_in_the_runs(http, platform, clock):
    c, pid, member = http
    await make_target(c, pid, member)
    assert (await c.post(triggers(pid), headers=member, json=schedule_body("doomed", cron="* * * * *"))).status_code == 202
    await platform.serverless.triggers.wait_idle()
    assert (await c.delete(f"/v1/projects/{pid}/services/target",
                           headers=bearer(platform, await admin_of(platform)))).status_code == 204
    clock.advance(timedelta(minutes=1).total_seconds())
    assert await platform.serverless.triggers.run_due() == 1
    (run,) = (await c.get(f"{triggers(pid)}/doomed", headers=member)).json()["runs"]
    assert run["status"] == "failed" and "no longer exists" in run["error"]


async def admin_of(platform):
    return (await project_users(platform, prefix="adm")).admin


class FakePushSubscriptions:
    """Stands in for the messaging area: records the subscriptions the platform asks for."""

    def __init__(self):
        self.subscriptions: dict[tuple[str, str], str] = {}
        self.deleted: list[str] = []

    async def ensure_push_subscription(self, project_id, topic, subscription, push_url, content_mode):
        assert content_mode == "cloudevents-binary"
        if topic == "missing":
            raise LookupError(f'topic "{topic}" does not exist in this project')
        self.subscriptions[(topic, subscription)] = push_url

    async def delete_push_subscription(self, project_id, topic, subscription):
        self.deleted.append(subscription)
        self.subscriptions.pop((topic, subscription), None)


async def test_pubsub_trigger_creates_a_push_subscription_whose_url_reaches_the_service(http, platform, received):
    c, pid, member = http
    await make_target(c, pid, member)
    body = {"name": "on-order", "target": {"service": "target", "path": "/events"},
            "source": {"type": "pubsub", "pubsub": {"topic": "orders"}}}
    # Without messaging the trigger stays pending and says why.
    platform.serverless.triggers.pubsub = None
    assert (await c.post(triggers(pid), headers=member, json=body)).status_code == 202
    await platform.serverless.triggers.wait_idle()
    pending = (await c.get(f"{triggers(pid)}/on-order", headers=member)).json()
    assert pending["state"] == "pending" and "messaging service is not available" in pending["message"]
    await c.delete(f"{triggers(pid)}/on-order", headers=member)

    hook = FakePushSubscriptions()
    platform.serverless.triggers.pubsub = hook
    created = (await c.post(triggers(pid), headers=member, json=body)).json()
    await platform.serverless.triggers.wait_idle()
    ready = (await c.get(f"{triggers(pid)}/on-order", headers=member)).json()
    assert ready["state"] == "ready" and ready["ready"] is True
    push_url = hook.subscriptions[("orders", "trigger-on-order")]
    assert push_url == created["delivery_url"]

    # What the messaging push deliverer does with a message, through the platform's internal transport:
    # it reads the answer as a stream (a response that cannot be streamed would never be acknowledged).
    async with httpx.AsyncClient(transport=platform.serverless.internal_transport()) as client:
        async with client.stream("POST", push_url, content=b'{"order": 7}', headers={
            "content-type": "application/json", "ce-specversion": "1.0", "ce-type": "ai.platform.pubsub.message.v1",
            "ce-id": "m-1", "ce-source": "topics/orders", "ce-subscription": "trigger-on-order",
            "ce-deliveryattempt": "1"}) as response:
            answer = b"".join([chunk async for chunk in response.aiter_raw()])
    assert response.status_code == 200 and answer
    (run,) = (await c.get(f"{triggers(pid)}/on-order", headers=member)).json()["runs"]
    assert run["occurrence"] == "m-1#1" and run["status"] == "succeeded" and run["http_status"] == 200
    (delivered,) = received.requests
    assert delivered["path"] == "/events" and delivered["body"] == '{"order": 7}'
    assert delivered["headers"]["ce-type"] == "ai.platform.pubsub.message.v1" and delivered["headers"]["ce-id"] == "m-1"

    broken = {**body, "name": "on-missing", "source": {"type": "pubsub", "pubsub": {"topic": "missing"}}}
    await c.post(triggers(pid), headers=member, json=broken)
    await platform.serverless.triggers.wait_idle()
    stuck = (await c.get(f"{triggers(pid)}/on-missing", headers=member)).json()
    assert stuck["state"] == "pending" and "does not exist" in stuck["message"]

    assert (await c.delete(f"{triggers(pid)}/on-order", headers=member)).status_code == 204
    assert hook.deleted == ["trigger-on-order"]


class FakeDirectory:
    """The agents area's `AgentDirectory.invoke_target` for one agent."""

    def __init__(self, target):
        self.target = target

    async def invoke_target(self, principal, name, project):
        from caiplatform.errors import NotFound

        if name != self.target.agent or project != self.target.project_id:
            raise NotFound(f"unknown agent: {name}")
        return self.target


async def test_a_schedule_fires_an_agent_through_the_directory(http, platform, users, clock, received):
    from caiplatform.ports.runtime import RevisionSpec
    from caiplatform.services.agent_directory import InvokeTarget
    from caiplatform.services.serverless_triggers import directory_finder

    c, pid, member = http
    workload = WorkloadRef(pid, users.project_short, "helper", kind="agent")
    await platform.runtime.apply(RevisionSpec(workload, "helper-00001", 1, "registry.local/cai-x-helper@sha256:1"))
    target = InvokeTarget("helper", "agent-id", pid, users.project_short, "agent", "langgraph", workload)
    platform.serverless.triggers.find_workload = directory_finder(FakeDirectory(target))
    body = {"name": "agent-cron", "target": {"service": "helper"},
            "source": {"type": "schedule", "schedule": {"cron": "0 * * * *", "payload": '{"message": "hello"}'}}}
    r = await c.post(triggers(pid), headers=member, json=body)
    assert r.status_code == 400 and "an agent serves only /invoke and /invoke/stream" in r.json()["error"]
    body["target"]["path"] = "/invoke"
    r = await c.post(triggers(pid), headers=member, json=body)
    assert r.status_code == 202 and r.json()["delivery_url"].endswith("/invoke")
    await platform.serverless.triggers.wait_idle()
    clock.advance(hours=1)
    assert await platform.serverless.triggers.run_due() == 1
    (request,) = received.requests
    assert request["path"] == "/invoke" and request["body"] == '{"message": "hello"}'
    assert request["revision"] == "helper-00001"


async def test_internal_hostnames_resolve_only_to_services_of_their_project(platform, users, http):
    c, pid, member = http
    await make_target(c, pid, member)
    ns = f"cai-p-{users.project_short}"
    for host in (f"target.{ns}", f"target.{ns}.svc", f"target.{ns}.svc.cluster.local"):
        found = await platform.serverless.resolve_internal(host)
        assert found is not None and found[0].name == "target" and found[0].project_id == pid
    for host in ("target.cai-p-other.svc", f"ghost.{ns}.svc", "example.com", f"target.{ns}.svc.cluster",
                 f"blue-target.{ns}.svc"):
        assert await platform.serverless.resolve_internal(host) is None


async def test_tagged_internal_addresses_reach_their_revision(platform, users, http, received):
    c, pid, member = http
    await make_target(c, pid, member)
    url = f"/v1/projects/{pid}/services/target"
    await c.patch(url, headers=member, json={"env": {"V": "2"}})
    split = await c.post(f"{url}:set-traffic", headers=member, json={"traffic": [
        {"revision_name": "target-00001", "percent": 0, "tag": "blue"},
        {"latest_revision": True, "percent": 100}]})
    assert split.status_code == 202
    tagged = next(t for t in split.json()["status"]["traffic"] if t["tag"] == "blue")
    assert tagged["url"] == f"http://blue-target.cai-p-{users.project_short}.svc.cluster.local"
    async with httpx.AsyncClient(transport=platform.serverless.internal_transport()) as client:
        assert (await client.post(tagged["url"] + "/x")).json()["revision"] == "target-00001"
        plain = tagged["url"].replace("blue-target", "target")
        assert (await client.post(plain + "/x")).json()["revision"] == "target-00002"


async def test_an_objectstore_trigger_fires_once_per_new_or_changed_object(http, platform, clock, received, users):
    import json
    import os

    c, pid, member = http
    await make_target(c, pid, member)
    body = {"name": "uploads", "target": {"service": "target", "path": "/objects"},
            "source": {"type": "objectstore", "objectstore": {"bucket": "inbox", "prefix": "in/"}}}
    r = await c.post(triggers(pid), headers=member, json=body)
    assert r.status_code == 202 and r.json()["source"] == {"type": "objectstore",
                                                            "objectstore": {"bucket": "inbox", "prefix": "in/"}}
    scheduler = platform.serverless.triggers
    await scheduler.wait_idle()
    assert (await c.get(f"{triggers(pid)}/uploads", headers=member)).json()["state"] == "ready"
    bucket = scheduler.bucket_dir(users.project_short, "inbox")
    assert bucket.is_dir()
    since = clock.now().timestamp()

    def put(name: str, text: str, at: float) -> None:
        path = bucket / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (at, at))

    put("in/old.json", "{}", since - 60)  # there before the trigger: never fires
    put("in/a.json", '{"a": 1}', since + 10)
    put("other/b.json", "{}", since + 10)  # outside the prefix
    put("in/.partial", "{}", since + 10)  # hidden: an upload in progress
    assert await scheduler.run_due(force_poll=True) == 1
    assert await scheduler.run_due(force_poll=True) == 0
    (event,) = received.requests
    assert event["path"] == "/objects" and event["headers"]["ce-type"] == "ai.platform.objectstore.object.v1.finalized"
    assert json.loads(event["body"]) == {"bucket": "inbox", "name": "in/a.json", "size": 8,
                                         "updated": json.loads(event["body"])["updated"]}
    put("in/a.json", '{"a": 22}', since + 20)  # changed: fires again
    assert await scheduler.run_due(force_poll=True) == 1
    runs = (await c.get(f"{triggers(pid)}/uploads", headers=member)).json()["runs"]
    assert len(runs) == 2 and all(run["status"] == "succeeded" for run in runs)


class FakeTopics:
    """The two calls `TopicPushSubscriptions` makes on the messaging area's `TopicService`."""

    def __init__(self):
        self.ready = False
        self.created: list[tuple[str, str, dict]] = []
        self.deleted: list[tuple[str, str]] = []

    async def create_subscription(self, principal, project_id, topic, body):
        from caiplatform.errors import Conflict

        assert principal.kind.value == "internal"
        if not self.ready:
            raise Conflict("the topic is not ready yet; poll it until state.ready is true, then retry")
        if any(name == body.name for _, name, _ in self.created):  # body: a SubscriptionCreate
            raise Conflict("a subscription with that name already exists on this topic")
        self.created.append((topic, body.name, body.model_dump(exclude_none=True)))
        return {}

    async def delete_subscription(self, principal, project_id, topic, name):
        from caiplatform.errors import NotFound

        if not any(n == name for _, n, _ in self.created):
            raise NotFound("subscription not found")
        self.deleted.append((topic, name))
        return {}


async def test_pubsub_trigger_waits_for_its_topic_through_the_messaging_adapter(http, platform):
    from caiplatform.services.serverless_triggers import TopicPushSubscriptions

    c, pid, member = http
    await make_target(c, pid, member)
    topics = FakeTopics()
    platform.serverless.triggers.pubsub = TopicPushSubscriptions(topics)
    body = {"name": "on-event", "target": {"service": "target", "path": "/events"},
            "source": {"type": "pubsub", "pubsub": {"topic": "events"}}}
    created = (await c.post(triggers(pid), headers=member, json=body)).json()
    await platform.serverless.triggers.wait_idle()
    pending = (await c.get(f"{triggers(pid)}/on-event", headers=member)).json()
    assert pending["state"] == "pending" and "not ready" in pending["message"]
    topics.ready = True
    await platform.serverless.triggers.run_due(force_poll=True)
    ready = (await c.get(f"{triggers(pid)}/on-event", headers=member)).json()
    assert ready["state"] == "ready" and "message" not in ready
    ((topic, name, sub),) = topics.created
    assert topic == "events" and name == "trigger-on-event"
    assert sub["deliver"] == {"mode": "push", "push": {"url": created["delivery_url"],
                                                       "content_mode": "cloudevents-binary"}}
    # Set up again (e.g. after a PATCH): an existing subscription is fine.
    await TopicPushSubscriptions(topics).ensure_push_subscription(pid, "events", "trigger-on-event",
                                                                  created["delivery_url"], "cloudevents-binary")
    assert (await c.delete(f"{triggers(pid)}/on-event", headers=member)).status_code == 204
    assert topics.deleted == [("events", "trigger-on-event")]
    await TopicPushSubscriptions(topics).delete_push_subscription(pid, "events", "gone")  # idempotent


class RecordingPushTargets:
    """The messaging area's `PushTargets` registration calls."""

    def __init__(self):
        self.routes: dict[str, tuple[str, httpx.AsyncBaseTransport]] = {}

    def register(self, service, namespace, base_url, transport=None):
        self.routes[f"{service}.{namespace}"] = (base_url, transport)

    def unregister(self, service, namespace):
        self.routes.pop(f"{service}.{namespace}", None)


async def test_services_register_their_private_hostname_for_push_delivery(http, platform, users, received):
    c, pid, member = http
    targets = RecordingPushTargets()
    platform.serverless.push_targets = targets
    await make_target(c, pid, member, name="sink")
    key = f"sink.cai-p-{users.project_short}"
    base_url, transport = targets.routes[key]
    assert base_url == f"http://{key}.svc.cluster.local"
    async with httpx.AsyncClient(transport=transport) as client:
        assert (await client.post(base_url + "/pushed", content=b"x")).status_code == 200
    assert received.requests[-1]["path"] == "/pushed"
    admin = bearer(platform, (await project_users(platform, prefix="push")).admin)
    assert (await c.delete(f"/v1/projects/{pid}/services/sink", headers=admin)).status_code == 204
    assert key not in targets.routes
