"""The messaging API over the machine's NATS JetStream (in-process HTTP, `CAI_NATS_URL`)."""

from __future__ import annotations

import asyncio
import base64
import secrets

import pytest

from caiplatform.models.messaging import PublishRequest, SubscriptionCreate, TopicCreate
from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client
from caiplatform.testing.polling import eventually


@pytest.fixture
async def js_api(settings, nats_url, api_for):
    platform = Platform.in_memory(settings.model_copy(update={"nats_url": nats_url}))
    await platform.start()
    try:
        async with asgi_client(platform) as client:
            api = await api_for(platform, client)
            yield api
            for topic in (await client.get(api.topics, headers=api.admin)).json()["topics"]:
                await client.delete(api.topic(topic["name"]), headers=api.admin)
    finally:
        await platform.aclose()


async def test_flow_on_jetstream(js_api):
    api = js_api
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "t", "max_bytes": "4Ki", "discard": "new"})).status_code == 201
    assert (await c.post(api.subs("t"), headers=api.admin, json={"name": "s", "ack_deadline_seconds": 1})).status_code == 201
    r = await c.post(api.topic("t") + ":publish", headers=api.member,
                     json={"messages": [{"text": "one", "attributes": {"k": "v"}, "key": "a"}, {"text": "two"}]})
    assert r.status_code == 200
    ids = r.json()["message_ids"]
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": 5, "timeout_ms": 1000})
    messages = r.json()["messages"]
    assert [m["id"] for m in messages] == ids and messages[0]["attributes"] == {"k": "v"} and messages[0]["key"] == "a"
    # unacknowledged past the deadline: redelivered with the attempt counted
    async def redelivered():
        r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": 5, "timeout_ms": 200})
        return r.json()["messages"]

    again = await eventually(redelivered, "the redelivery after the 1 s ack deadline")
    assert [m["delivery_attempt"] for m in again] == [2, 2]
    # the first delivery's ack id is stale but still names this subscription; acknowledge the fresh ones
    r = await c.post(api.sub("t", "s") + ":ack", headers=api.member, json={"ack_ids": [m["ack_id"] for m in again]})
    assert r.json() == {"acknowledged": 2}

    async def drained():
        state = (await c.get(api.sub("t", "s"), headers=api.member)).json()["state"]
        return state["backlog"] == 0 and state["unacknowledged"] == 0

    await eventually(drained, "the acknowledged messages to leave the subscription")
    r = await c.post(api.sub("t", "s") + ":ack", headers=api.member, json={"ack_ids": [base64.urlsafe_b64encode(b"$JS.ACK.x.y.1.1.1.1.1").decode()]})
    assert r.status_code == 400
    blob = {"text": "x" * 1500}
    r = await c.post(api.topic("t") + ":publish", headers=api.member, json={"messages": [blob] * 4})
    assert r.status_code == 207 and 1 <= r.json()["published"] < 4
    r = await c.post(api.topic("t") + ":publish", headers=api.member, json={"messages": [blob]})
    assert r.status_code == 409
    r = await c.post(api.sub("t", "s") + ":pull", headers=api.member, json={"max_messages": 10, "auto_ack": True, "timeout_ms": 1000})
    assert r.status_code == 200 and r.json()["acknowledged"] == len(r.json()["messages"]) >= 1
    quota = (await c.get(f"/v1/projects/{api.pid}/pubsub/quota", headers=api.member)).json()
    assert quota["allocated_bytes"] == 4096 and quota["provisioned"] is True


async def test_deleting_a_project_removes_its_streams_consumers_and_push_delivery(settings, nats_url):
    """A project's topics are JetStream streams with durable consumers: deleting the project deletes them
    on the server, and the push worker stops delivering its push subscriptions."""
    from caiplatform.testing.users import bootstrap_admin, delete_project, new_project

    platform = Platform.in_memory(settings.model_copy(update={"nats_url": nats_url}))
    await platform.start()
    try:
        admin = await bootstrap_admin(platform)
        project = await new_project(platform, f"doomed-{secrets.token_hex(3)}")
        topics = platform.topics
        for name in ("events", "audit"):
            await topics.create_topic(admin, project.id, TopicCreate(name=name))
        await topics.create_subscription(admin, project.id, "events", SubscriptionCreate(name="reader"))
        await topics.create_subscription(admin, project.id, "events", SubscriptionCreate.parse({
            "name": "pusher", "deliver": {"mode": "push", "push": {"url": f"http://hook.{project.namespace}/in"}}}))
        await topics.publish(admin, project.id, "events",
                             PublishRequest.parse({"messages": [{"text": "kept until the project goes"}]}))
        streams = [f"cai-{project.short}-{name}" for name in ("events", "audit")]
        broker, worker = topics.broker, platform.components["push_worker"]
        assert all([await broker.stream_stats(s) for s in streams])
        assert await broker.consumer_stats(streams[0], "reader") and await broker.consumer_stats(streams[0], "pusher")
        assert (streams[0], "pusher") in worker._tasks

        await delete_project(platform, project.id)

        assert [await broker.stream_stats(s) for s in streams] == [None, None]  # asked of the NATS server
        assert await broker.consumer_stats(streams[0], "reader") is None
        assert (streams[0], "pusher") not in worker._tasks
        assert project.short not in await topics.broker_layout()  # its broker credential reaches nothing
        assert await topics.purge_project(project.id) == 0
    finally:
        await platform.aclose()


async def test_a_push_subscription_counts_its_worker_once(js_api):
    """`state.consumers` on JetStream: the push worker's waiting pull is the one reader of a push
    subscription, not one more beside it."""
    api = js_api
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "events"})).status_code == 201
    push = {"mode": "push", "push": {"url": f"http://worker.cai-p-{api.short}"}}
    assert (await c.post(api.subs("events"), headers=api.admin, json={"name": "p", "deliver": push})).status_code == 201

    async def consumers() -> int:
        return (await c.get(api.sub("events", "p"), headers=api.member)).json()["state"]["consumers"]

    async def one_reader() -> bool:
        return await consumers() == 1

    await eventually(one_reader, "the push worker's reader of the subscription")
    seen = set()
    for _ in range(10):  # and it stays one through the worker's next pulls (sampled over a second)
        await asyncio.sleep(0.1)
        seen.add(await consumers())
    assert seen == {1}



async def test_a_publish_retried_with_its_idempotency_key_after_a_timeout_stores_each_message_once(js_api, monkeypatch):
    """A publish whose acknowledgements do not come in time answers 503, and JetStream stores its messages
    anyway once they reach it (as when NATS is paused). Retried with the same `Idempotency-Key`, the
    publish answers each stored message's id and stores none again; the same key from another caller is
    that caller's own request."""
    from caiplatform.adapters.nats import broker as nats_broker

    api = js_api
    c = api.client
    assert (await c.post(api.topics, headers=api.admin, json={"name": "t"})).status_code == 201
    assert (await c.post(api.subs("t"), headers=api.admin, json={"name": "s"})).status_code == 201
    body = {"messages": [{"text": f"m{i}"} for i in range(3)]}
    key = {"Idempotency-Key": "order-7f3a"}
    monkeypatch.setattr(nats_broker, "PUBLISH_ACK_WAIT", 0.0)  # the acknowledgements never come in time
    timed_out = await c.post(api.topic("t") + ":publish", headers={**api.member, **key}, json=body)
    assert timed_out.status_code == 503, timed_out.text
    monkeypatch.undo()

    async def stored() -> bool:
        state = (await c.get(api.sub("t", "s"), headers=api.member)).json()["state"]
        return state["backlog"] == 3

    await eventually(stored, "the timed-out publish's messages to land", timeout=30)  # what a client retrying sees later
    retried = await c.post(api.topic("t") + ":publish", headers={**api.member, **key}, json=body)
    assert retried.status_code == 200, retried.text
    ids = retried.json()["message_ids"]
    again = await c.post(api.topic("t") + ":publish", headers={**api.member, **key}, json=body)
    assert again.json()["message_ids"] == ids  # and again: still the same messages

    async def pulled_all() -> list:
        r = await c.post(api.sub("t", "s") + ":pull", headers=api.member,
                         json={"max_messages": 10, "timeout_ms": 500, "auto_ack": True})
        return r.json()["messages"]

    got = await eventually(pulled_all, "the messages", timeout=30)
    got += await pulled_all()  # anything more would be a duplicate
    assert [m["id"] for m in got] == ids and [base64.b64decode(m["data"]) for m in got] == [b"m0", b"m1", b"m2"]
    other = await c.post(api.topic("t") + ":publish", headers={**api.admin, **key}, json=body)
    assert other.status_code == 200 and set(other.json()["message_ids"]).isdisjoint(ids)
    bad = await c.post(api.topic("t") + ":publish", headers={**api.member, "Idempotency-Key": "x" * 201}, json=body)
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["error"]
