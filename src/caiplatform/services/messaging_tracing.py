"""A message's publish and its push delivery in one trace (docs/observability.md "Traces").

While tracing is on, `TopicService.publish_to` runs in a PRODUCER span `publish <topic>` (the messaging
semantic conventions' send span; a batch shares it, as its one creation context) and every message carries
that span's W3C trace context (`OutgoingMessage.trace`: NATS headers `traceparent`, `tracestate` on
JetStream). The push worker's CONSUMER span `process <topic>` continues it (a child, with a link to it:
`tracing.span(carrier=...)`). Off, the publish is called as it is: one test of a module variable.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from caiplatform import tracing
from caiplatform.domain.messaging import Topic
from caiplatform.ports.broker import OutgoingMessage

Publish = TypeVar("Publish", bound=Callable[..., Awaitable[Any]])


def traced_publish(publish_to: Publish) -> Publish:
    """Wrap `publish_to(self, topic, messages)` in the producer span and hand the messages its context."""

    @functools.wraps(publish_to)
    async def publish(self: Any, topic: Topic, messages: list[OutgoingMessage]) -> Any:
        if tracing.tracer() is None:
            return await publish_to(self, topic, messages)
        with tracing.span(f"publish {topic.name}", {
                "messaging.system": "nats", "messaging.operation.name": "publish",
                "messaging.operation.type": "send", "messaging.destination.name": topic.name,
                "messaging.batch.message_count": len(messages) if len(messages) > 1 else None,
                "caiplatform.project": topic.project_short}, kind="PRODUCER") as current:
            carrier: dict[str, str] = {}
            tracing.inject(carrier)  # the producer span's own context (it is the current span here)
            if carrier:
                messages = [dataclasses.replace(message, trace=carrier) for message in messages]
            status, result = await publish_to(self, topic, messages)
            ids = getattr(result, "message_ids", None) or []
            if len(ids) == 1:
                current.set_attribute("messaging.message.id", ids[0])
            if status != 200:  # a partial publish (207): what was stored is delivered, the rest is not
                tracing.set_error(current, str(getattr(result, "error", "") or f"HTTP {status}"))
            return status, result

    return cast(Publish, publish)
