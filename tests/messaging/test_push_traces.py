"""While tracing is on, each push delivery is a trace of its own (a CONSUMER `process <topic>` span with
its outcome) and the push endpoint receives its `traceparent`."""

from __future__ import annotations

import pytest

from caiplatform import tracing

from .test_push import _publish, _setup, receiver, watch  # noqa: F401 - fixtures of the push tests


@pytest.fixture
def spans():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=tracing.traces_start_at_work(ALWAYS_ON))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.activate(provider)
    yield exporter
    tracing.deactivate()
    provider.shutdown()


async def test_a_delivery_is_a_trace_the_endpoint_continues(api, receiver, watch, spans):  # noqa: F811
    await _setup(api, "cloudevents-binary")
    await _publish(api, {"text": "hello"})
    await receiver.wait_for(1)
    await watch.until("ack", 1)
    headers, _ = receiver.requests[0]
    _, trace_id, parent_id, _ = headers["traceparent"].split("-")
    (process,) = [s for s in spans.get_finished_spans() if s.name == "process events"]
    assert process.kind.name == "CONSUMER" and process.parent is None
    assert (f"{process.context.trace_id:032x}", f"{process.context.span_id:016x}") == (trace_id, parent_id)
    assert process.attributes["messaging.destination.name"] == "events"
    assert process.attributes["caiplatform.push.outcome"] == "acked"
