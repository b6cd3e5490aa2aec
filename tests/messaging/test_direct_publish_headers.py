"""Issue 26: a holder of the direct broker credential publishes with headers of its own choosing; a pull
through the platform takes only well-formed attributes and keys, and never fails on the rest."""

from __future__ import annotations

import uuid

import nats

from caiplatform.adapters.nats.broker import ATTRIBUTES_HEADER, KEY_HEADER, JetStreamBroker
from caiplatform.ports.broker import ConsumerConfig, StreamConfig

HOSTILE_HEADERS = [
    {ATTRIBUTES_HEADER: "[" * 5000 + "]" * 5000, KEY_HEADER: '{"a":' * 3000 + "1" + "}" * 3000},
    {ATTRIBUTES_HEADER: "not json", KEY_HEADER: "NaN"},
    {ATTRIBUTES_HEADER: '["a", "b"]', KEY_HEADER: "12"},
    {ATTRIBUTES_HEADER: '{"n": 1}', KEY_HEADER: '"k"'},
]


async def test_malformed_headers_of_a_direct_publish_are_dropped(nats_url):
    broker = JetStreamBroker(nats_url)
    name = f"direct-{uuid.uuid4().hex[:10]}"
    stream = StreamConfig(name=name, subject=name.replace("-", "."), max_bytes=1024 * 1024)
    await broker.create_stream(stream)
    direct = await nats.connect(nats_url)
    try:
        await broker.create_consumer(ConsumerConfig(name, "c1", ack_wait=5))
        js = direct.jetstream()
        for headers in HOSTILE_HEADERS:
            await js.publish(stream.subject, b"payload", headers=headers)
        got = await broker.pull(name, "c1", 10, 2.0)
        assert [(d.attributes, d.key) for d in got] == [({}, None), ({}, None), ({}, None), ({}, "k")]
    finally:
        await direct.close()
        await broker.delete_stream(name)
        await broker.close()
