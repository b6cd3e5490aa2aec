"""Issue 26: a holder of the direct broker credential publishes with headers of its own choosing; a pull
through the platform takes only well-formed attributes and keys, and never fails on the rest. The W3C
trace context travels in headers of its own (issue 38)."""

from __future__ import annotations

import uuid

import nats

from caiplatform.adapters.nats.broker import ATTRIBUTES_HEADER, KEY_HEADER, MSG_ID_HEADER, JetStreamBroker
from caiplatform.ports.broker import ConsumerConfig, OutgoingMessage, StreamConfig

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


async def test_the_trace_context_travels_in_the_headers(nats_url):
    """`traceparent`/`tracestate` ride along (only those names: a header the platform writes keeps its
    value); a direct client's own trace headers reach the delivery, an overlong one does not."""
    broker = JetStreamBroker(nats_url)
    name = f"trace-{uuid.uuid4().hex[:10]}"
    stream = StreamConfig(name=name, subject=name.replace("-", "."), max_bytes=1024 * 1024)
    await broker.create_stream(stream)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    direct = await nats.connect(nats_url)
    try:
        await broker.create_consumer(ConsumerConfig(name, "c1", ack_wait=5))
        trace = {"traceparent": traceparent, "tracestate": "cai=1", MSG_ID_HEADER: "forged", KEY_HEADER: '"forged"'}
        await broker.publish(name, stream.subject, [OutgoingMessage(b"a", {}, "k", "id-1", trace), OutgoingMessage(b"b")])
        js = direct.jetstream()
        await js.publish(stream.subject, b"c", headers={"traceparent": traceparent})
        await js.publish(stream.subject, b"d", headers={"traceparent": "0" * 5000})
        got = await broker.pull(name, "c1", 10, 2.0)
        assert [(d.data, d.key, d.trace) for d in got] == [
            (b"a", "k", {"traceparent": traceparent, "tracestate": "cai=1"}), (b"b", None, None),
            (b"c", None, {"traceparent": traceparent}), (b"d", None, {})]
        # the id is the platform's, not the trace's: publishing "id-1" again is a duplicate
        assert await broker.publish(name, stream.subject, [OutgoingMessage(b"a", msg_id="id-1")]) == [got[0].sequence]
    finally:
        await direct.close()
        await broker.delete_stream(name)
        await broker.close()
