"""What does the platform add to an invoke?

Starts `caiplatform serve` on the embedded defaults and deploys an echo LangGraph agent (one node that
returns the message, no model). Then one call of each path in turn, the order rotating, so that machine
noise hits all paths alike:

- buffered: p50 and p99 latency of `POST /invoke` on the agent's harness directly (over its instance's Unix
  socket, with the body, ids and secrets the platform sends) vs `POST /v1/agents/<name>/invoke` on the platform;
- streamed: time to the first NDJSON line, directly vs through the platform.

Each call starts a new session on both paths, so the harness does the same work. The added latency is
the difference of the two percentiles. A third path, a bare Starlette proxy of a few lines in front of
the same harness, measures the floor: what any Python hop on the path costs on this machine.

    python benchmarks/invoke_bench.py [--requests 100] [--rounds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from benchsupport import PROXY_APP, QUICK, Row, bare_app, ms, percentile, report, signed_ms
from served import HarnessEndpoint, served

AGENT = "echo"
BODY = {"message": "hello from the benchmark"}
TARGET_P50, TARGET_P99, TARGET_TTFL = 0.002, 0.005, 0.002


Turn = Callable[[], tuple[bytes, dict[str, str]]]


def platform_turn() -> tuple[bytes, dict[str, str]]:
    """What the benchmark sends the platform: the message alone (the platform mints the ids)."""
    return json.dumps(BODY).encode(), {"Content-Type": "application/json"}


async def buffered(client: httpx.AsyncClient, url: str, turn: Turn) -> float:
    body, headers = turn()
    start = time.perf_counter()
    response = await client.post(url, content=body, headers=headers)
    response.raise_for_status()
    return time.perf_counter() - start


async def first_line(client: httpx.AsyncClient, url: str, turn: Turn) -> float:
    body, headers = turn()
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", url, content=body, headers=headers) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if first is None and line.strip():
                first = time.perf_counter() - start
    assert first is not None, "the stream had no line"
    return first


async def alternate(n: int, rounds: int, **paths: Callable[[], Awaitable[float]]) -> dict[str, list[float]]:
    """`n * rounds` calls of each path, one call of each path in turn (the order rotating), so that a
    burst of load on the machine lands on all paths alike."""
    out: dict[str, list[float]] = {name: [] for name in paths}
    items = list(paths.items())
    for i in range(n * rounds):
        shift = i % len(items)
        for name, fn in items[shift:] + items[:shift]:
            out[name].append(await fn())
    return out


async def measure(base_url: str, harness: HarnessEndpoint, proxy_port: int, requests: int, rounds: int) -> dict[str, list[float]]:
    direct_url = "http://harness/invoke"  # on the instance's socket
    platform_url = f"{base_url}/v1/agents/{AGENT}/invoke"
    proxy_url = f"http://127.0.0.1:{proxy_port}/invoke"

    def direct_turn() -> tuple[bytes, dict[str, str]]:  # a new session, its ids minted as the platform does
        return harness.fresh_turn(BODY["message"])

    def proxy_turn() -> tuple[bytes, dict[str, str]]:  # the same, the proxy adding the instance's secrets
        body, headers = direct_turn()
        return body, {k: headers[k] for k in ("Content-Type", "X-CAI-Session-Id", "X-CAI-User-Id")}

    async with httpx.AsyncClient(timeout=60) as client, harness.client() as direct:
        for _ in range(20):  # warm both paths and their connections
            await buffered(direct, direct_url, direct_turn)
            await buffered(client, platform_url, platform_turn)
        return await alternate(
            requests, rounds,
            direct=lambda: buffered(direct, direct_url, direct_turn),
            platform=lambda: buffered(client, platform_url, platform_turn),
            proxy=lambda: buffered(client, proxy_url, proxy_turn),
            direct_ttfl=lambda: first_line(direct, direct_url + "/stream", direct_turn),
            platform_ttfl=lambda: first_line(client, platform_url + "/stream", platform_turn),
            proxy_ttfl=lambda: first_line(client, proxy_url + "/stream", proxy_turn),
        )


async def main(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cai-invoke-bench-") as tmp, \
            served(Path(tmp) / "data", CAI_SCALE_TO_ZERO_SECONDS="3600") as platform:
        platform.deploy(AGENT)
        platform.wait_ready(AGENT)
        httpx.post(f"{platform.base_url}/v1/agents/{AGENT}/invoke", json=BODY, timeout=300).raise_for_status()
        harness = platform.harness_endpoints()[AGENT]
        proxy, proxy_port = bare_app(Path(tmp), PROXY_APP, "proxy_app", env={
            "BENCH_HARNESS_SOCKET": harness.socket, "BENCH_HARNESS_TOKEN": harness.token,
            "BENCH_INTERNAL_TOKEN": harness.internal or ""})
        try:
            got = await measure(platform.base_url, harness, proxy_port, requests, rounds)
        finally:
            proxy.stop()

    def added(kind: str, p: float, through: str = "platform") -> float:
        return percentile(got[through + kind], p) - percentile(got["direct" + kind], p)

    def floor(kind: str, p: float) -> str:
        return f"floor: a bare Python proxy in front of the harness adds {ms(added(kind, p, 'proxy'))}"

    print(f"invoke: {rounds * requests} calls of each path in turn, echo LangGraph agent on caiplatform serve")
    p50, p99, ttfl = added("", 50), added("", 99), added("_ttfl", 50)
    report(
        Row("Buffered invoke, echo LangGraph agent, added p50",
            ms(percentile(got["platform"], 50)), f"harness directly {ms(percentile(got['direct'], 50))}",
            signed_ms(p50), f"added ≤ {ms(TARGET_P50)}", p50 <= TARGET_P50, note=floor("", 50)),
        Row("Buffered invoke, added p99",
            ms(percentile(got["platform"], 99)), f"harness directly {ms(percentile(got['direct'], 99))}",
            signed_ms(p99), f"added ≤ {ms(TARGET_P99)}", p99 <= TARGET_P99, note=floor("", 99)),
        Row("Streamed invoke, time to first line, added p50",
            ms(percentile(got["platform_ttfl"], 50)), f"harness directly {ms(percentile(got['direct_ttfl'], 50))}",
            signed_ms(ttfl), f"added ≤ {ms(TARGET_TTFL)}", ttfl <= TARGET_TTFL, note=floor("_ttfl", 50)),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=25 if QUICK else 100)
    parser.add_argument("--rounds", type=int, default=4 if QUICK else 6)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
