"""The broker conformance suite over the in-memory adapter and NATS JetStream (the machine's server)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from caiplatform.clock import ManualClock
from caiplatform.testing.conformance.broker import *  # noqa: F403


class Kit:
    def __init__(self, broker, advance):
        self.broker = broker
        self._advance = advance
        self.prefix = f"cnf-{uuid.uuid4().hex[:10]}"
        self.streams: list[str] = []

    def name(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}-{len(self.streams)}"
        self.streams.append(name)
        return name

    async def advance(self, seconds: float) -> None:
        await self._advance(seconds)


@pytest.fixture(params=["memory", "nats"])
async def broker_kit(request):
    if request.param == "memory":
        from caiplatform.adapters.memory.broker import InMemoryBroker

        clock = ManualClock()
        broker = InMemoryBroker(clock=clock)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        yield Kit(broker, advance)
        return
    from caiplatform.adapters.nats.broker import JetStreamBroker

    broker = JetStreamBroker(request.getfixturevalue("nats_url"))
    kit = Kit(broker, asyncio.sleep)
    try:
        yield kit
    finally:
        for name in kit.streams:
            await broker.delete_stream(name)
        await broker.close()
