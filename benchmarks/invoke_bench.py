"""What does the platform add to an invoke?

Starts one harness (`python -m caiplatform.harness`, a Python function, as the local runtime runs it)
and the platform's HTTP API (`create_app` on an in-memory platform, served by uvicorn) whose invoke
path reaches that harness. Then, alternating rounds so machine noise hits both alike:

- buffered: median and p99 latency of `POST /invoke` on the harness directly vs
  `POST /v1/agents/<name>/invoke` on the platform; the platform's added latency and the ratio;
- streamed: time to the first NDJSON line, directly vs through the platform;
- throughput: invokes per second with `--concurrency` requests in flight on the one warm instance.

    python benchmarks/invoke_bench.py [--requests 300] [--rounds 3] [--concurrency 16]

A ratio near 1.0 means the control plane costs little beside the agent itself. The function answers at
once, so the numbers are the platform's overhead alone (a model call would dwarf them).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import uvicorn

from caiplatform.platform import Platform
from caiplatform.ports.runtime import Endpoint
from caiplatform.settings import Settings
from caiplatform.supervisor import ProcessSpec, ProcessSupervisor, free_port
from caiplatform.testing.example_agents import PYTHON_FUNCTION
from caiplatform.testing.invoke import StaticDirectory, target_for
from caiplatform.testing.turn_checks import write_agent
from caiplatform_server.app import create_app

AGENT = "bench-fn"
BODY = {"message": "hello from the benchmark"}


class FixedInstance:
    """A runtime with one warm instance at a fixed address (the part of `acquire` measured elsewhere)."""

    def __init__(self, base_url: str):
        self.base_url = base_url

    async def acquire(self, ref, *, timeout: float, tag: str | None = None) -> Endpoint:
        async def release() -> None:
            return None

        return Endpoint(revision=f"{ref.name}-00001", base_url=self.base_url, release=release)


def serve_platform(port: int, harness_url: str) -> None:
    """The platform's HTTP API with the benchmark agent in its directory, served by uvicorn."""
    settings = Settings(CAI_INTERNAL_TOKEN="bench-internal", RATELIMIT_RPS=1e9, RATELIMIT_BURST=10**9)
    platform = Platform.in_memory(settings)
    directory = StaticDirectory()
    directory.add(target_for(AGENT, "function", project_id=str(uuid.uuid4())))
    platform.invoke.attach(directory=directory, runtime=FixedInstance(harness_url))
    uvicorn.run(create_app(platform, apis=["core"], manage_lifecycle=False), host="127.0.0.1", port=port,
                log_level="warning", access_log=False)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def latencies(client: httpx.AsyncClient, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        response = await client.post(url, json=BODY)
        response.raise_for_status()
        out.append(time.perf_counter() - start)
    return out


async def first_lines(client: httpx.AsyncClient, url: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        first: float | None = None
        async with client.stream("POST", url, json=BODY) as response:
            async for line in response.aiter_lines():
                if first is None and line.strip():
                    first = time.perf_counter() - start
        assert first is not None, "the stream had no line"
        out.append(first)
    return out


async def throughput(client: httpx.AsyncClient, url: str, n: int, concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            (await client.post(url, json=BODY)).raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    return n / (time.perf_counter() - start)


async def main(requests: int, rounds: int, concurrency: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="invoke-bench-"))
    code = write_agent(work / AGENT, PYTHON_FUNCTION)
    harness_port, api_port = free_port(), free_port()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {"CAI_FRAMEWORK": "function", "CAI_CODE_DIR": str(code), "AGENT_NAME": AGENT, "CAI_SESSION_STORE": "memory",
           "CAI_INTERNAL_TOKEN": "bench-internal", "PORT": str(harness_port), "PATH": os.environ.get("PATH", ""),
           "HOME": os.environ.get("HOME", "/"), "PYTHONPATH": src}
    harness_url = f"http://127.0.0.1:{harness_port}"

    async def healthy() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as c:
                return (await c.get(harness_url + "/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    async with ProcessSupervisor(work / "run") as supervisor:
        await supervisor.start(ProcessSpec(name="bench-harness", argv=[sys.executable, "-m", "caiplatform.harness"],
                                           env=env, health=healthy, restart=False, inherit_env=False))
        # The platform runs in a process of its own, like the harness, so the client's work (this
        # process) is not charged to it.
        server = multiprocessing.get_context("spawn").Process(target=serve_platform, args=(api_port, harness_url),
                                                              daemon=True)
        server.start()
        async with httpx.AsyncClient(timeout=2) as probe:
            while True:
                try:
                    if (await probe.get(f"http://127.0.0.1:{api_port}/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    await asyncio.sleep(0.1)
        direct_url = harness_url + "/invoke"
        platform_url = f"http://127.0.0.1:{api_port}/v1/agents/{AGENT}/invoke"
        limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
        try:
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                await latencies(client, direct_url, 20)  # warm both paths
                await latencies(client, platform_url, 20)
                results: dict[str, list[float]] = {k: [] for k in ("direct", "platform", "direct_ttfl", "platform_ttfl")}
                rates: dict[str, list[float]] = {"direct": [], "platform": []}
                for _ in range(rounds):
                    results["direct"] += await latencies(client, direct_url, requests)
                    results["platform"] += await latencies(client, platform_url, requests)
                    results["direct_ttfl"] += await first_lines(client, direct_url + "/stream", requests // 3)
                    results["platform_ttfl"] += await first_lines(client, platform_url + "/stream", requests // 3)
                    rates["direct"].append(await throughput(client, direct_url, requests, concurrency))
                    rates["platform"].append(await throughput(client, platform_url, requests, concurrency))
        finally:
            server.terminate()
            server.join(10)

    def ms(value: float) -> str:
        return f"{value * 1000:7.2f} ms"

    print(f"invoke overhead, {rounds} rounds x {requests} requests, one warm instance of a Python function")
    for kind, label in (("", "buffered"), ("_ttfl", "streamed, time to first line")):
        direct, through = results["direct" + kind], results["platform" + kind]
        d50, p50 = statistics.median(direct), statistics.median(through)
        d99, p99 = percentile(direct, 99), percentile(through, 99)
        print(f"{label}:")
        print(f"  median  direct {ms(d50)}  platform {ms(p50)}  added {ms(p50 - d50)}  ratio {p50 / d50:.2f}")
        print(f"  p99     direct {ms(d99)}  platform {ms(p99)}  added {ms(p99 - d99)}  ratio {p99 / d99:.2f}")
    d_rate, p_rate = statistics.median(rates["direct"]), statistics.median(rates["platform"])
    print(f"throughput, {concurrency} in flight: direct {d_rate:7.1f}/s  platform {p_rate:7.1f}/s  "
          f"ratio {p_rate / d_rate:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds, args.concurrency))
