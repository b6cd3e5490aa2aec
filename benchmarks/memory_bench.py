"""How much memory does `caiplatform serve` hold, and does it grow with use?

Starts `caiplatform serve` on the embedded defaults and reports the resident size (VmRSS) of the server
process, and of the server with its children (the supervised engines and agent instances):

1. idle, nothing deployed;
2. with 10 Python-function agents deployed and scaled to zero;
3. with the 10 warm (one invoke each);
4. across many invokes of one warm agent: the server's resident size after the first tenth of them
   (warmed up) and after all; the growth is the difference (target: no growth beyond noise, 10 MiB).

    python benchmarks/memory_bench.py [--invokes 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, descendants, report, rss_mib
from served import served

AGENTS = 10
GROWTH_LIMIT_MIB = 10.0


def own_rss(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def instances(pid: int) -> int:
    count = 0
    for child in descendants(pid):
        try:
            if b"caiplatform.harness" in Path(f"/proc/{child}/cmdline").read_bytes():
                count += 1
        except OSError:
            continue
    return count


async def invoke_many(base_url: str, n: int, concurrency: int = 8) -> None:
    url = f"{base_url}/v1/agents/fn0/invoke"
    left = n

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            (await client.post(url, json={"message": "hi"})).raise_for_status()

    async with httpx.AsyncClient(timeout=60) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


async def wake_all(base_url: str) -> None:
    """One invoke of each agent at once, so all are warm together."""
    async with httpx.AsyncClient(timeout=300) as client:
        answers = await asyncio.gather(*(client.post(f"{base_url}/v1/agents/fn{i}/invoke", json={"message": "hi"})
                                         for i in range(AGENTS)))
    for answer in answers:
        answer.raise_for_status()


def main(invokes: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cai-mem-bench-") as tmp, \
            served(Path(tmp) / "data", CAI_SCALE_TO_ZERO_SECONDS="8") as platform:
        time.sleep(2)
        idle, idle_all = own_rss(platform.pid), rss_mib(platform.pid)
        for i in range(AGENTS):
            platform.deploy(f"fn{i}", framework="function")
        for i in range(AGENTS):
            platform.wait_ready(f"fn{i}")
        deadline = time.monotonic() + 120
        while instances(platform.pid):
            assert time.monotonic() < deadline, "the agents did not scale to zero"
            time.sleep(0.2)
        cold, cold_all = own_rss(platform.pid), rss_mib(platform.pid)
        asyncio.run(wake_all(platform.base_url))
        warm, warm_all = own_rss(platform.pid), rss_mib(platform.pid)
        warm_instances = instances(platform.pid)
        platform.http.patch("/v1/agents/fn0/config", json={"scaling": {"min_scale": 1}})
        platform.wait_ready("fn0")
        asyncio.run(invoke_many(platform.base_url, invokes // 10))
        settled = own_rss(platform.pid)
        asyncio.run(invoke_many(platform.base_url, invokes - invokes // 10))
        after = own_rss(platform.pid)
    print(f"memory of caiplatform serve (server process | with its children), {invokes} invokes")
    print(f"  idle                                  {idle:7.0f} MiB | {idle_all:7.0f} MiB")
    print(f"  {AGENTS} agents deployed, scaled to zero     {cold:7.0f} MiB | {cold_all:7.0f} MiB")
    print(f"  {AGENTS} agents warm ({warm_instances} instances)          {warm:7.0f} MiB | {warm_all:7.0f} MiB")
    print(f"  after {invokes // 10} invokes {settled:7.0f} MiB, after {invokes} {after:7.0f} MiB")
    growth = after - settled
    report(
        Row("Resident size of caiplatform serve", f"idle {idle:.0f} MiB; {AGENTS} scaled to zero {cold:.0f} MiB; "
            f"{AGENTS} warm {warm:.0f} MiB (server process)", f"with children: {idle_all:.0f} / {cold_all:.0f} / "
            f"{warm_all:.0f} MiB", "—", "report", True),
        Row(f"Growth across {invokes} invokes", f"{growth:+.1f} MiB", f"after the first {invokes // 10}: {settled:.0f} MiB",
            "—", f"none (≤ {GROWTH_LIMIT_MIB:.0f} MiB)", growth <= GROWTH_LIMIT_MIB),
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--invokes", type=int, default=1000 if QUICK else 10_000)
    main(parser.parse_args().invokes)
