"""What does the platform add to an invoke?

Starts `caiplatform serve` on the embedded defaults and deploys an echo LangGraph agent (one node that
returns the message, no model). Then, alternating rounds so machine noise hits both alike:

- buffered: p50 and p99 latency of `POST /invoke` on the agent's harness directly (its loopback
  address, the body and headers the platform sends) vs `POST /v1/agents/<name>/invoke` on the platform;
- streamed: time to the first NDJSON line, directly vs through the platform.

Each call starts a new session on both paths, so the harness does the same work. The added latency is
the difference of the two percentiles.

    python benchmarks/invoke_bench.py [--requests 200] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, ms, percentile, report
from served import INTERNAL_TOKEN, served

AGENT = "echo"
BODY = {"message": "hello from the benchmark"}
TARGET_P50, TARGET_P99, TARGET_TTFL = 0.002, 0.005, 0.002


async def buffered(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    response = await client.post(url, json=BODY, headers=headers)
    response.raise_for_status()
    return time.perf_counter() - start


async def first_line(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, json=BODY, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.strip():
                first = time.perf_counter() - start
    assert first is not None, "the stream had no line"
    return first


async def alternate(n: int, rounds: int, **paths: Callable[[], Awaitable[float]]) -> dict[str, list[float]]:
    """`n` calls of each path a round, one path after the other, first path alternating."""
    out: dict[str, list[float]] = {name: [] for name in paths}
    items = list(paths.items())
    for r in range(rounds):
        for name, fn in items if r % 2 == 0 else reversed(items):
            out[name] += [await fn() for _ in range(n)]
    return out


async def measure(base_url: str, harness_port: int, requests: int, rounds: int) -> dict[str, list[float]]:
    direct_url = f"http://127.0.0.1:{harness_port}/invoke"
    platform_url = f"{base_url}/v1/agents/{AGENT}/invoke"
    internal = {"X-CAI-Internal": INTERNAL_TOKEN}
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(20):  # warm both paths and their connections
            await buffered(client, direct_url, internal)
            await buffered(client, platform_url, {})
        return await alternate(
            requests, rounds,
            direct=lambda: buffered(client, direct_url, internal),
            platform=lambda: buffered(client, platform_url, {}),
            direct_ttfl=lambda: first_line(client, direct_url + "/stream", internal),
            platform_ttfl=lambda: first_line(client, platform_url + "/stream", {}),
        )


async def main(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cai-invoke-bench-") as tmp, \
            served(Path(tmp) / "data", CAI_SCALE_TO_ZERO_SECONDS="3600") as platform:
        platform.deploy(AGENT)
        platform.wait_ready(AGENT)
        httpx.post(f"{platform.base_url}/v1/agents/{AGENT}/invoke", json=BODY, timeout=300).raise_for_status()
        port = platform.harness_ports()[AGENT]
        got = await measure(platform.base_url, port, requests, rounds)

    def added(kind: str, p: float) -> float:
        return percentile(got["platform" + kind], p) - percentile(got["direct" + kind], p)

    print(f"invoke: {rounds} alternating rounds x {requests} calls, echo LangGraph agent on caiplatform serve")
    p50, p99, ttfl = added("", 50), added("", 99), added("_ttfl", 50)
    report(
        Row("Buffered invoke, echo LangGraph agent, added p50",
            ms(percentile(got["platform"], 50)), f"harness directly {ms(percentile(got['direct'], 50))}",
            f"+{ms(p50)}", f"added ≤ {ms(TARGET_P50)}", p50 <= TARGET_P50),
        Row("Buffered invoke, added p99",
            ms(percentile(got["platform"], 99)), f"harness directly {ms(percentile(got['direct'], 99))}",
            f"+{ms(p99)}", f"added ≤ {ms(TARGET_P99)}", p99 <= TARGET_P99),
        Row("Streamed invoke, time to first line, added p50",
            ms(percentile(got["platform_ttfl"], 50)), f"harness directly {ms(percentile(got['direct_ttfl'], 50))}",
            f"+{ms(ttfl)}", f"added ≤ {ms(TARGET_TTFL)}", ttfl <= TARGET_TTFL),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50 if QUICK else 200)
    parser.add_argument("--rounds", type=int, default=4 if QUICK else 6)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
