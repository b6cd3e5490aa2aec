"""A restart of the NATS server in the middle of delivery loses no message whose publish was acknowledged:
JetStream keeps streams and consumer positions in its file store, and the adapter reconnects."""

from __future__ import annotations

import asyncio

from caiplatform.adapters.nats.broker import JetStreamBroker
from caiplatform.ports.broker import BrokerError, ConsumerConfig, OutgoingMessage, StreamConfig
from caiplatform.supervisor.engines import NATS_NAME, start_nats
from caiplatform.supervisor.process import ProcessSupervisor


async def _pull_until(broker: JetStreamBroker, want: int, seen: set[bytes], timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(seen) < want:
        assert loop.time() < deadline, f"only {len(seen)} of {want} messages came back"
        try:
            deliveries = await broker.pull("restart", "c", 50, 1.0)
            if deliveries:
                await broker.ack([d.token for d in deliveries])
        except BrokerError:  # the server is still coming back
            await asyncio.sleep(0.2)
            continue
        seen.update(d.data for d in deliveries)


async def test_restart_during_delivery_loses_nothing(tmp_path):
    sup = ProcessSupervisor(tmp_path / "run", backoff_initial=0.05, backoff_max=0.5)
    broker = None
    try:
        url = await start_nats(sup, tmp_path)
        broker = JetStreamBroker(url)
        await broker.create_stream(StreamConfig("restart", "restart.subject", 16 * 1024 * 1024))
        await broker.create_consumer(ConsumerConfig("restart", "c", ack_wait=2))
        sent = {f"m{i}".encode() for i in range(60)}
        await broker.publish("restart", "restart.subject", [OutgoingMessage(data) for data in sorted(sent)])
        seen: set[bytes] = set()
        first = await broker.pull("restart", "c", 20, 2.0)
        await broker.ack([d.token for d in first[:10]])  # ten acknowledged, ten in flight, forty waiting
        seen.update(d.data for d in first[:10])
        await sup.stop(NATS_NAME)
        assert await start_nats(sup, tmp_path) == url
        await broker.wait_ready()
        await _pull_until(broker, len(sent), seen)
        assert seen == sent
    finally:
        if broker is not None:
            await broker.close()
        await sup.stop_all()
