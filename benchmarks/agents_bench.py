"""How long does a deploy take to become ready, and what does a cold start cost?

Runs the embedded default exactly as `caiplatform serve` does — the local builder (an image directory
with its own Python environment) and the local process runtime (each instance a supervised subprocess
running the harness) — on a fresh data dir, with a Python function whose `requirements.txt` names one
small package:

1. deploy to ready, first build: entry check, environment created, requirements installed, source
   copied, revision applied, first instance healthy;
2. deploy to ready after a source change with unchanged requirements (the environment is reused), printed
   with its ratio to (1);
3. a warm request (median over many) and the first request after the revision scaled to zero (a cold
   start: process start, harness import, health check, then the request), printed with their ratio.

    python benchmarks/agents_bench.py [--rounds 3] [--warm 30] [--requirement tabulate]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from caiplatform.adapters.local.builder import LocalBuilder
from caiplatform.adapters.local.runtime import LocalProcessRuntime
from caiplatform.ports.builder import BuildRequest
from caiplatform.ports.runtime import RevisionSpec, WorkloadRef
from caiplatform.testing.sources import write_tree

IDLE_SECONDS = 1.0


def function_source(root: Path, version: int, requirement: str) -> Path:
    module = requirement.replace("-", "_")
    return write_tree(root, {
        "main.py": f"import {module}\n\n\ndef handle(event, context):\n    return {{'version': {version}, 'event': event}}\n",
        "requirements.txt": f"{requirement}\n",
    })


async def wait_ready(runtime: LocalProcessRuntime, ref: WorkloadRef, revision: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        status = await runtime.status(ref)
        current = next((r for r in status.revisions if r.name == revision), None) if status else None
        if current is not None and current.state == "ready":
            return
        if current is not None and current.state == "not_ready":
            raise SystemExit(f"{revision} is not ready: {current.reason}: {current.message}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{revision} not ready after {timeout} s")
        await asyncio.sleep(0.02)


async def deploy(builder: LocalBuilder, runtime: LocalProcessRuntime, ref: WorkloadRef, source: Path, generation: int) -> float:
    started = time.perf_counter()
    image = await builder.build(BuildRequest(ref.project_id, ref.project_short, ref.name, "function", source))
    revision = f"{ref.name}-{generation:05d}"
    await runtime.apply(RevisionSpec(
        ref, revision, generation, image.reference,
        env={"AGENT_NAME": ref.name, "AGENT_IMAGE": image.reference, "CAI_SESSION_STORE": "memory"},
    ))
    await wait_ready(runtime, ref, revision)
    return time.perf_counter() - started


async def request(runtime: LocalProcessRuntime, ref: WorkloadRef, client: httpx.AsyncClient) -> float:
    """One invoke through `acquire` (a pooled client, as the platform's proxy keeps one)."""
    started = time.perf_counter()
    endpoint = await runtime.acquire(ref, timeout=120)
    try:
        response = await client.post(f"{endpoint.base_url}/invoke", json={"message": "ping"})
        response.raise_for_status()
    finally:
        await endpoint.release()
    return time.perf_counter() - started


async def scaled_to_zero(runtime: LocalProcessRuntime, ref: WorkloadRef) -> None:
    while True:
        status = await runtime.status(ref)
        if status is not None and all(r.replicas == 0 for r in status.revisions):
            return
        await asyncio.sleep(0.05)


async def one_round(args: argparse.Namespace) -> tuple[float, float, float, float]:
    with tempfile.TemporaryDirectory(prefix="cai-agents-bench-") as tmp:
        data = Path(tmp) / "data"
        builder = LocalBuilder(data)
        runtime = LocalProcessRuntime(data, images=builder.resolve, idle_seconds=IDLE_SECONDS)
        await runtime.start()
        project = str(uuid.uuid4())
        ref = WorkloadRef(project, project[:8], "bench", kind="function")
        client = httpx.AsyncClient(timeout=120)
        try:
            first = await deploy(builder, runtime, ref, function_source(Path(tmp) / "v1", 1, args.requirement), 1)
            rebuild = await deploy(builder, runtime, ref, function_source(Path(tmp) / "v2", 2, args.requirement), 2)
            await request(runtime, ref, client)  # make sure an instance of the newest revision is up
            warm = statistics.median([await request(runtime, ref, client) for _ in range(args.warm)])
            await scaled_to_zero(runtime, ref)
            cold = await request(runtime, ref, client)
        finally:
            await client.aclose()
            await runtime.close()
        return first, rebuild, warm, cold


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", type=int, default=30, help="warm requests per round (the median counts)")
    parser.add_argument("--requirement", default="tabulate", help="the one package requirements.txt names")
    args = parser.parse_args()
    if importlib.util.find_spec("caiplatform.harness") is None:
        raise SystemExit("agents_bench needs the harness (caiplatform.harness), which every instance runs")
    results = [await one_round(args) for _ in range(args.rounds)]
    first, rebuild, warm, cold = (statistics.median(column) for column in zip(*results, strict=True))
    print(f"agents: median of {args.rounds} rounds on a fresh data dir (python {sys.version.split()[0]})")
    print(f"  deploy to ready, first build (environment + pip install): {first:8.2f} s")
    print(f"  deploy to ready, rebuild with unchanged requirements:     {rebuild:8.2f} s   "
          f"ratio rebuild/first {rebuild / first:.2f}")
    print(f"  warm request (median of {args.warm}):                          {warm * 1000:8.1f} ms")
    print(f"  cold start, first request after scale to zero:           {cold * 1000:8.1f} ms  "
          f"ratio cold/warm {cold / warm:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
