"""What does the platform's service routing add to a request?

Runs one serverless service on the embedded platform with the local process runtime (an image our own
builder made, started with its own `command` as `<its environment's python> -m caiplatform.testing.tiny_app`),
serves the platform's ASGI app with uvicorn on a free loopback port, and times sequential `GET /whoami`
requests two ways, alternating rounds so machine noise hits both alike:

- routed: to the platform with `Host: <name>-<short>.<apps_domain>` (host routing, runtime slot, proxy);
- direct: to the instance itself, as the platform's proxy reaches it: over the Unix socket bound into its
  sandbox, with its secret (`X-CAI-Harness-Token`). A service's own command listens on `$PORT` in its own
  network namespace behind the platform's relay on that socket, so both paths pass the relay; the
  benchmark finds the socket and the secret as any root process could (`served.service_endpoints`:
  bubblewrap's binds and the relay's `/proc/<pid>/environ`), nothing in the platform is there for it.

It prints requests per second of each and the ratio direct / routed (how many times slower the routed
path is; 1.0 would mean routing is free).

    python benchmarks/serverless_bench.py [--requests 500] [--rounds 3]   (CAI_BENCH_QUICK=1: 100 and 3)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn
from benchsupport import QUICK
from served import service_endpoints

from caiplatform.models.serverless import ServiceCreate
from caiplatform.platform import Platform
from caiplatform.ports.builder import BuildRequest
from caiplatform.principal import Principal
from caiplatform.settings import Settings
from caiplatform.supervisor import free_port
from caiplatform.testing.sources import FUNCTION
from caiplatform_server.app import create_app


async def rate(client: httpx.AsyncClient, url: str, requests: int, headers: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        response = await client.get(url, headers=headers)
        response.raise_for_status()
    return requests / (time.perf_counter() - start)


async def main(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "src"
        source.mkdir()
        for name, text in FUNCTION.items():
            (source / name).write_text(text)
        settings = Settings(CAI_ADMIN_EMAIL="bench@example.com", CAI_ADMIN_PASSWORD="benchmark password",
                            RATELIMIT_RPS=1e9, RATELIMIT_BURST=10**9)
        platform = Platform.embedded(Path(tmp) / "data", settings)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(platform, ["serverless"]), host="127.0.0.1", port=port,
                                               log_level="warning"))
        task = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.05)
            principal = Principal.automation()
            from sqlalchemy import select

            from caiplatform.db.models import Project

            pid = platform.db.run_sync(lambda s: s.scalar(select(Project.id).where(Project.slug == "default")))
            project = await platform.serverless.project(principal, pid)
            image = await platform.builder.build(BuildRequest(project.id, project.short, "bench", "function", source))
            await platform.serverless.create(principal, pid, ServiceCreate.parse({
                "name": "bench", "image": image.reference, "command": [image.command[0]],
                "args": ["-m", "caiplatform.testing.tiny_app"], "publish": {"enabled": True},
                "scaling": {"min_scale": 1, "max_scale": 1}}))
            ref = platform.serverless.ref(project, "bench")
            endpoint = await platform.runtime.acquire(ref, timeout=60)  # its instance is running
            await endpoint.release()
            instance = service_endpoints(os.getpid())["bench"]
            direct_url = "http://harness/whoami"  # on the instance's socket
            host = {"Host": platform.hosts.host_for("bench", project.short)}
            routed_url = f"http://127.0.0.1:{port}/whoami"
            direct, routed = [], []
            async with httpx.AsyncClient(timeout=30) as client, instance.client(timeout=30) as socket:
                await rate(client, routed_url, 20, host)  # warm both paths
                await rate(socket, direct_url, 20, instance.credentials)
                for _ in range(rounds):
                    direct.append(await rate(socket, direct_url, requests, instance.credentials))
                    routed.append(await rate(client, routed_url, requests, host))
            d, r = statistics.median(direct), statistics.median(routed)
            print(f"direct to the instance : {d:9.0f} requests/s")
            print(f"routed by the platform : {r:9.0f} requests/s")
            print(f"ratio direct/routed    : {d / r:9.2f}x")
        finally:
            server.should_exit = True
            await task
            await platform.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100 if QUICK else 500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.rounds))
