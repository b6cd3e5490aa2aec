"""Spec-fidelity audit of the serverless API (document 3) over HTTP, in-process on the in-memory
platform: the cases an earlier pass missed."""

from __future__ import annotations

import pytest

from caiplatform.ports.runtime import RevisionSpec, WorkloadRef
from caiplatform.services.agent_directory import InvokeTarget
from caiplatform.services.serverless_triggers import directory_finder
from caiplatform.testing.http import asgi_client
from caiplatform.testing.users import bearer

IMAGE = "registry.local/cai-test-target@sha256:" + "c" * 64


@pytest.fixture
async def http(platform, users):
    async with asgi_client(platform, ["serverless"]) as c:
        yield c, users.project_id, bearer(platform, users.member)


def schedule(name: str, service: str, payload, path: str = "/") -> dict:
    return {"name": name, "target": {"service": service, "path": path},
            "source": {"type": "schedule", "schedule": {"cron": "0 * * * *", "payload": payload}}}


async def test_a_schedule_payload_must_be_json(http):
    """The payload is "a JSON string sent as the request body verbatim": text that is not JSON is refused
    at create (and PATCH), not found out at every firing."""
    c, pid, member = http
    r = await c.post(f"/v1/projects/{pid}/services", headers=member, json={"name": "target", "image": IMAGE})
    assert r.status_code == 202, r.text
    triggers = f"/v1/projects/{pid}/triggers"
    for payload in ("hello", "{'a': 1}", '{"a": 1'):
        r = await c.post(triggers, headers=member, json=schedule("tick", "target", payload))
        assert r.status_code == 400, r.text
        assert r.json()["error"].startswith(
            "source.schedule.payload must be a JSON document (it is sent verbatim as the request body): ")
    for name, payload in (("empty", ""), ("object", '{"a": 1}'), ("number", "42")):
        r = await c.post(triggers, headers=member, json=schedule(name, "target", payload))
        assert r.status_code == 202, r.text
        assert r.json()["source"]["schedule"]["payload"] == payload
    r = await c.patch(f"{triggers}/object", headers=member, json={"source": schedule("", "", "nope")["source"]})
    assert r.status_code == 400
    assert (await c.get(f"{triggers}/object", headers=member)).json()["source"]["schedule"]["payload"] == '{"a": 1}'
    assert [t["name"] for t in (await c.get(triggers, headers=member)).json()["triggers"]] == ["empty", "number",
                                                                                               "object"]


class OneAgent:
    """The agents area's directory, holding one agent."""

    def __init__(self, target: InvokeTarget):
        self.target = target

    async def invoke_target(self, principal, name, project):
        from caiplatform.errors import NotFound

        if name != self.target.agent or project != self.target.project_id:
            raise NotFound(f"unknown agent: {name}")
        return self.target


async def test_an_agent_schedule_payload_is_an_invoke_body_with_a_message(http, platform, users):
    """For an agent target the payload "is an invoke body containing `message`"."""
    c, pid, member = http
    workload = WorkloadRef(pid, users.project_short, "helper", kind="agent")
    await platform.runtime.apply(RevisionSpec(workload, "helper-00001", 1, "registry.local/cai-x-helper@sha256:1"))
    target = InvokeTarget("helper", "agent-id", pid, users.project_short, "agent", "langgraph", workload)
    platform.serverless.triggers.find_workload = directory_finder(OneAgent(target))
    triggers = f"/v1/projects/{pid}/triggers"
    for payload in ("", "{}", '{"message": ""}', '{"message": 5}', '["hello"]', '{"session_id": "s"}'):
        r = await c.post(triggers, headers=member, json=schedule("nightly", "helper", payload, "/invoke"))
        assert r.status_code == 400, (payload, r.text)
        assert r.json()["error"] == (
            'source.schedule.payload for an agent is its invoke body: a JSON object with a non-empty "message" '
            '(and "session_id" to continue one conversation), for example {"message": "hello"}')
    r = await c.post(triggers, headers=member,
                     json=schedule("nightly", "helper", '{"message": "summarize", "session_id": "s1"}', "/invoke"))
    assert r.status_code == 202, r.text


async def test_a_verb_path_with_another_http_method_is_405(http):
    """`:set-traffic` takes POST: GET, PATCH or DELETE on it is a wrong method, not a service named
    `hello:set-traffic`; an unknown verb is the document's 404."""
    c, pid, member = http
    services = f"/v1/projects/{pid}/services"
    assert (await c.post(services, headers=member, json={"name": "hello", "image": IMAGE})).status_code == 202
    for method in ("GET", "PATCH", "DELETE"):
        r = await c.request(method, f"{services}/hello:set-traffic", headers=member,
                            json={} if method == "PATCH" else None)
        assert r.status_code == 405 and r.json()["error"] == "':set-traffic' is called with POST"
    r = await c.get(f"{services}/hello:frob", headers=member)
    assert r.status_code == 404
    assert r.json()["error"] == "unknown method ':frob' - the supported one is ':set-traffic'"
    assert (await c.get(f"{services}/hello", headers=member)).status_code == 200


async def test_a_push_delivery_to_a_service_is_acknowledged(platform, users, received):
    """At-least-once, not forever: a push subscription (or a pubsub trigger) delivering to a service's
    private hostname gets the service's 2xx and acknowledges the message. The internal transport's answer
    must be readable as a stream (the push worker reads at most 64 KiB of it); an already-read answer made
    the worker's loop fail after the 2xx, so the message came back at every ack deadline."""
    import asyncio

    async with asgi_client(platform, ["serverless", "pubsub"]) as c:
        pid, member, admin = users.project_id, bearer(platform, users.member), bearer(platform, users.admin)
        r = await c.post(f"/v1/projects/{pid}/services", headers=member, json={"name": "sink", "image": IMAGE})
        assert r.status_code == 202, r.text
        topics = f"/v1/projects/{pid}/topics"
        assert (await c.post(topics, headers=admin, json={"name": "events"})).status_code == 201
        push = {"mode": "push", "push": {"url": f"http://sink.cai-p-{users.project_short}/in",
                                         "content_mode": "cloudevents-binary"}}
        r = await c.post(f"{topics}/events/subscriptions", headers=admin, json={"name": "to-sink", "deliver": push})
        assert r.status_code == 201, r.text
        r = await c.post(f"{topics}/events:publish", headers=member, json={"messages": [{"text": "one"}, {"text": "two"}]})
        assert r.status_code == 200, r.text
        state: dict = {}
        for _ in range(60):
            await asyncio.sleep(0.05)
            state = (await c.get(f"{topics}/events/subscriptions/to-sink", headers=member)).json()["state"]
            if len([q for q in received.requests if q["path"] == "/in"]) == 2 and state["unacknowledged"] == 0:
                break
        assert sorted(q["body"] for q in received.requests if q["path"] == "/in") == ["one", "two"]
        assert state["unacknowledged"] == 0 and state["backlog"] == 0, state


async def test_a_service_cannot_take_the_name_of_an_agent(http, platform, users):
    """Agents, functions and serverless services are services of one project namespace (a trigger targets
    any of them by name) and share the public hostname `<name>-<short>`: a service named like an agent
    is the document's 409, and the agent keeps its address."""
    c, pid, member = http
    workload = WorkloadRef(pid, users.project_short, "helper", kind="agent")
    target = InvokeTarget("helper", "agent-id", pid, users.project_short, "agent", "langgraph", workload)
    platform.serverless.triggers.find_workload = directory_finder(OneAgent(target))
    host = platform.hosts.host_for("helper", users.project_short)

    async def agent_upstream():
        raise AssertionError("not called")

    platform.hosts.register(host, agent_upstream)
    services = f"/v1/projects/{pid}/services"
    for publish in (False, True):
        r = await c.post(services, headers=member, json={"name": "helper", "image": IMAGE,
                                                          "publish": {"enabled": publish}})
        assert r.status_code == 409 and r.json()["error"] == "a service with that name already exists in this project"
    assert platform.hosts.lookup(host) is agent_upstream
    assert (await c.get(services, headers=member)).json() == {"services": []}
    assert (await c.post(services, headers=member, json={"name": "other", "image": IMAGE})).status_code == 202


async def test_a_pubsub_trigger_follows_its_topic_being_deleted_and_made_again(platform, users):
    """A ready pubsub trigger whose topic is deleted cannot fire: it goes back to `pending` with the
    reason, and when the topic is made again its push subscription is made again and it is ready."""
    async with asgi_client(platform, ["serverless", "pubsub"]) as c:
        pid, member, admin = users.project_id, bearer(platform, users.member), bearer(platform, users.admin)
        triggers = platform.serverless.triggers
        assert (await c.post(f"/v1/projects/{pid}/services", headers=member,
                             json={"name": "sink", "image": IMAGE})).status_code == 202
        topics = f"/v1/projects/{pid}/topics"
        assert (await c.post(topics, headers=admin, json={"name": "orders"})).status_code == 201
        r = await c.post(f"/v1/projects/{pid}/triggers", headers=member, json={
            "name": "on-order", "target": {"service": "sink"}, "source": {"type": "pubsub", "pubsub": {"topic": "orders"}}})
        assert r.status_code == 202, r.text
        await triggers.wait_idle()

        async def trigger() -> dict:
            await triggers.run_due(force_poll=True)
            return (await c.get(f"/v1/projects/{pid}/triggers/on-order", headers=member)).json()

        assert (await trigger())["state"] == "ready"
        assert (await c.delete(f"{topics}/orders", headers=admin)).status_code == 202
        gone = await trigger()
        assert gone["state"] == "pending" and gone["ready"] is False and "topic not found" in gone["message"]
        assert (await c.post(topics, headers=admin, json={"name": "orders"})).status_code == 201
        back = await trigger()
        assert back["state"] == "ready" and "message" not in back
        subs = (await c.get(f"{topics}/orders/subscriptions", headers=member)).json()["subscriptions"]
        assert [s["name"] for s in subs] == ["trigger-on-order"]
