"""What does the messaging API cost over raw JetStream on the same server?

Publishes 100-message batches through the HTTP API (the ASGI app in-process, so the HTTP stack,
authentication, validation and the JetStream adapter are all measured, the network is not) and with a
plain nats-py client (`js.publish` per message) to the same NATS server; then drains the backlog with
`:pull` (100) + `:acknowledge` and with a raw pull consumer (`fetch(100)` + `ack`). Rounds alternate so
machine noise hits both alike; the ratio API / raw of messages per second is printed.

    python benchmarks/messaging_bench.py [--nats nats://127.0.0.1:4222] [--batches 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import nats
from nats.js import api as jsapi

from caiplatform.platform import Platform
from caiplatform.settings import Settings
from caiplatform.testing.http import asgi_client

BATCH = 100


async def raw_round(url: str, batches: int) -> tuple[float, float]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    name = f"bench-raw-{uuid.uuid4().hex[:8]}"
    await js.add_stream(jsapi.StreamConfig(name=name, subjects=[name], retention=jsapi.RetentionPolicy.INTEREST,
                                           storage=jsapi.StorageType.FILE, max_bytes=256 * 1024 * 1024))
    await js.add_consumer(name, jsapi.ConsumerConfig(durable_name="c", ack_policy=jsapi.AckPolicy.EXPLICIT))
    try:
        started = time.perf_counter()
        for b in range(batches):
            for i in range(BATCH):
                await js.publish(name, f"message {b}/{i}".encode())
        publish = time.perf_counter() - started
        psub = await js.pull_subscribe_bind("c", name)
        started = time.perf_counter()
        got = 0
        while got < batches * BATCH:
            msgs = await psub.fetch(BATCH, timeout=5)
            for msg in msgs:
                await msg.ack()
            got += len(msgs)
        await nc.flush()
        drain = time.perf_counter() - started
    finally:
        await js.delete_stream(name)
        await nc.close()
    return publish, drain


async def api_round(client, base: str, headers: dict[str, str], batches: int) -> tuple[float, float]:
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    assert (await client.post(base, headers=headers, json={"name": topic, "max_bytes": "256Mi"})).status_code == 201
    assert (await client.post(f"{base}/{topic}/subscriptions", headers=headers, json={"name": "c"})).status_code == 201
    try:
        started = time.perf_counter()
        for b in range(batches):
            body = {"messages": [{"text": f"message {b}/{i}"} for i in range(BATCH)]}
            r = await client.post(f"{base}/{topic}:publish", headers=headers, json=body)
            assert r.status_code == 200, r.text
        publish = time.perf_counter() - started
        started = time.perf_counter()
        got = 0
        while got < batches * BATCH:
            r = await client.post(f"{base}/{topic}/subscriptions/c:pull", headers=headers,
                                  json={"max_messages": BATCH, "timeout_ms": 5000})
            messages = r.json()["messages"]
            r = await client.post(f"{base}/{topic}/subscriptions/c:acknowledge", headers=headers,
                                  json={"ack_ids": [m["ack_id"] for m in messages]})
            assert r.status_code == 200, r.text
            got += len(messages)
        drain = time.perf_counter() - started
    finally:
        await client.delete(f"{base}/{topic}", headers=headers)
    return publish, drain


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nats", default="nats://127.0.0.1:4222")
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    settings = Settings(CAI_ADMIN_EMAIL="admin@example.com", CAI_ADMIN_PASSWORD="benchmark password",
                        CAI_AUTOMATION_TOKEN="bench-automation-token", CAI_NATS_URL=args.nats,
                        RATELIMIT_RPS=1_000_000, RATELIMIT_BURST=1_000_000)
    async with Platform.in_memory(settings) as platform, asgi_client(platform) as client:
        from sqlalchemy import select

        from caiplatform.db.models import Project

        pid = await platform.db.run(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
        base = f"/v1/projects/{pid}/topics"
        headers = {"Authorization": "Bearer bench-automation-token"}
        results: dict[str, list[float]] = {"api_pub": [], "raw_pub": [], "api_drain": [], "raw_drain": []}
        n = args.batches * BATCH
        for _ in range(args.rounds):
            pub, drain = await api_round(client, base, headers, args.batches)
            results["api_pub"].append(n / pub)
            results["api_drain"].append(n / drain)
            pub, drain = await raw_round(args.nats, args.batches)
            results["raw_pub"].append(n / pub)
            results["raw_drain"].append(n / drain)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"publish   : API {med['api_pub']:9.0f} msg/s   raw nats-py {med['raw_pub']:9.0f} msg/s   "
          f"ratio API/raw {med['api_pub'] / med['raw_pub']:.2f}")
    print(f"pull+ack  : API {med['api_drain']:9.0f} msg/s   raw nats-py {med['raw_drain']:9.0f} msg/s   "
          f"ratio API/raw {med['api_drain'] / med['raw_drain']:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
