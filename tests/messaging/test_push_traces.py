"""While tracing is on, a message's publish and its push delivery are one trace: the publish is a PRODUCER
span `publish <topic>` whose W3C context the message carries, each push delivery a CONSUMER span
`process <topic>` (its child, linked to it, with its outcome), and the push endpoint receives the delivery's
`traceparent`. A message that carries no trace context is delivered in a trace of its own."""

from __future__ import annotations

import pytest

from caiplatform import tracing
from caiplatform.ports.broker import OutgoingMessage
from caiplatform.testing.otlp import OTLPReceiver
from caiplatform.testing.polling import eventually

from .test_push import _publish, _setup, receiver, watch  # noqa: F401 - fixtures of the push tests

PRODUCER, CONSUMER = 4, 5  # OTLP's SpanKind numbers


def _provider(processor):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    provider = TracerProvider(sampler=tracing.traces_start_at_work(ALWAYS_ON))
    provider.add_span_processor(processor)
    return provider


@pytest.fixture
def spans():
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = _provider(SimpleSpanProcessor(exporter))
    tracing.activate(provider)
    yield exporter
    tracing.deactivate()
    provider.shutdown()


def _hex(context) -> tuple[str, str]:
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


async def test_a_publish_and_its_delivery_are_one_trace(api, receiver, watch, spans):  # noqa: F811
    await _setup(api, "cloudevents-binary")
    (message_id,) = await _publish(api, {"text": "hello"})
    await receiver.wait_for(1)
    await watch.until("ack", 1)
    finished = spans.get_finished_spans()
    (publish,) = [s for s in finished if s.name == "publish events"]
    (process,) = [s for s in finished if s.name == "process events"]
    (root,) = [s for s in finished if s.context.span_id == publish.parent.span_id]
    assert root.kind.name == "SERVER" and root.name == "POST /v1/projects/{project_id}/topics/{topic}"
    assert publish.kind.name == "PRODUCER"
    assert publish.attributes["messaging.destination.name"] == "events"
    assert publish.attributes["messaging.message.id"] == message_id
    # the conventions' consumer span: a child of the message's creation context, and linked to it
    assert process.kind.name == "CONSUMER" and process.parent.span_id == publish.context.span_id
    assert [link.context.span_id for link in process.links] == [publish.context.span_id]
    assert process.context.trace_id == publish.context.trace_id == root.context.trace_id
    assert process.attributes["messaging.message.id"] == message_id
    assert process.attributes["caiplatform.push.outcome"] == "acked"
    headers, _ = receiver.requests[0]
    _, trace_id, parent_id, _ = headers["traceparent"].split("-")
    assert _hex(process.context) == (trace_id, parent_id)


async def test_a_message_without_trace_context_is_a_trace_of_its_own(api, platform, receiver, watch, spans):  # noqa: F811
    await _setup(api, "cloudevents-binary")
    topic = platform.topics
    stream = next(iter(topic.broker._streams))  # the topic's stream: a message published around the API
    await topic.broker.publish(stream, topic.broker._streams[stream].config.subject, [OutgoingMessage(b"x")])
    await receiver.wait_for(1)
    await watch.until("ack", 1)
    (process,) = [s for s in spans.get_finished_spans() if s.name == "process events"]
    assert process.parent is None and not process.links
    assert process.attributes["messaging.destination.name"] == "events"
    assert process.attributes["caiplatform.push.outcome"] == "acked"
    headers, _ = receiver.requests[0]
    assert headers["traceparent"].split("-")[1] == f"{process.context.trace_id:032x}"


async def test_a_collector_gets_one_trace_for_a_publish_and_its_delivery(api, receiver, watch):  # noqa: F811
    """What an operator's collector receives (OTLP/HTTP, decoded with opentelemetry-proto)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    collector = OTLPReceiver()
    with collector.serve() as endpoint:
        provider = _provider(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces", timeout=5)))
        tracing.activate(provider)
        try:
            await _setup(api, "cloudevents-structured")
            r = await api.client.post(api.topic("events") + ":publish", headers=api.member,
                                      json={"messages": [{"text": "one"}]})
            assert r.status_code == 200, r.text
            await receiver.wait_for(1)
            await watch.until("ack", 1)

            def delivered() -> bool:
                return any(s.name == "process events" for s in collector.snapshot())

            await eventually(delivered, "the delivery's span at the collector")
        finally:
            tracing.deactivate()
            provider.shutdown()
    received = collector.snapshot()
    (root,) = [s for s in received if s.attributes.get("caiplatform.request_id") == r.headers["X-Request-Id"]]
    (publish,) = [s for s in received if s.name == "publish events"]
    (process,) = [s for s in received if s.name == "process events"]
    assert publish.kind == PRODUCER and process.kind == CONSUMER
    assert root.trace_id == publish.trace_id == process.trace_id
    assert (publish.parent_id, process.parent_id) == (root.span_id, publish.span_id)
    headers, _ = receiver.requests[0]
    assert headers["traceparent"].split("-")[1:3] == [process.trace_id, process.span_id]
