"""Does the platform add anything to a memory store's data path?

Provisions one instance through the local provisioner (a supervised Valkey with requirepass, maxmemory
and persistence, exactly as `caiplatform serve` runs it) and starts a plain `valkey-server` by hand from
the same binary with no configuration but a port. A redis-py loop of SET+GET round trips (and a
pipelined variant) runs against each, alternating rounds so machine noise hits both alike, and the
ratio provisioned / plain is printed. A ratio near 1.0 means the platform is not in the data path:
clients talk to the server directly.

    python benchmarks/memorystore_bench.py [--ops 20000] [--rounds 3]

Options `--persistence off` compares without AOF (the AOF's `everysec` fsync is the one cost a
persisted instance pays by design).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

from caiplatform.adapters.local.memorystore import LocalValkeyProvisioner, valkey_binary
from caiplatform.domain.memorystore import InstanceSpec, connection_uri
from caiplatform.supervisor import free_port


def round_trips(client: redis.Redis, ops: int) -> float:
    """SET then GET `ops` times; returns operations per second (each SET and GET counts)."""
    value = b"x" * 64
    start = time.perf_counter()
    for i in range(ops):
        key = f"bench:{i % 1000}"
        client.set(key, value)
        client.get(key)
    return 2 * ops / (time.perf_counter() - start)


def pipelined(client: redis.Redis, ops: int, batch: int = 100) -> float:
    value = b"x" * 64
    start = time.perf_counter()
    for base in range(0, ops, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(base, min(ops, base + batch)):
            pipe.set(f"bench:{i % 1000}", value)
            pipe.get(f"bench:{i % 1000}")
        pipe.execute()
    return 2 * ops / (time.perf_counter() - start)


def start_plain_server(folder: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    proc = subprocess.Popen(
        [valkey_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if redis.Redis(port=port, socket_connect_timeout=0.2).ping():
                return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("the plain valkey-server did not start")


async def provision(folder: Path, persistence: bool) -> tuple[LocalValkeyProvisioner, str]:
    provisioner = LocalValkeyProvisioner(folder)
    await provisioner.start()
    spec = InstanceSpec(project_id=str(uuid.uuid4()), project_short="bench", name="bench",
                        persistence_enabled=persistence)
    password = "bench-" + uuid.uuid4().hex
    await provisioner.create(spec, password)
    deadline = time.monotonic() + 30
    while True:
        inst = await provisioner.get(spec.project_id, spec.name)
        if inst and inst.ready:
            return provisioner, connection_uri(inst.host, inst.port, password)
        if time.monotonic() > deadline:
            raise SystemExit(f"the provisioned instance did not become ready: {inst}")
        await asyncio.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20000, help="SET+GET pairs per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--persistence", choices=["on", "off"], default="on")
    args = parser.parse_args(argv)

    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="cai-ms-bench-") as tmp:
        root = Path(tmp)
        (root / "plain").mkdir()
        provisioner, uri = loop.run_until_complete(provision(root / "platform", args.persistence == "on"))
        plain_proc, plain_port = start_plain_server(root / "plain")
        try:
            provisioned = redis.Redis.from_url(uri, protocol=2)
            plain = redis.Redis(port=plain_port, protocol=2)
            results: dict[str, dict[str, list[float]]] = {
                "round trips": {"provisioned": [], "plain": []},
                "pipelined": {"provisioned": [], "plain": []},
            }
            for client in (provisioned, plain):  # warm up connections and the server
                round_trips(client, 500)
            order = [("provisioned", provisioned), ("plain", plain)]
            for _ in range(args.rounds):
                order.reverse()  # alternate who goes first, so drift in machine load hits both alike
                for name, client in order:
                    results["round trips"][name].append(round_trips(client, args.ops))
                    results["pipelined"][name].append(pipelined(client, args.ops))
            provisioned.close()
            plain.close()
        finally:
            plain_proc.terminate()
            plain_proc.wait(10)
            loop.run_until_complete(provisioner.close())
            loop.close()

    print(f"valkey {valkey_binary()}; {args.ops} SET+GET pairs x {args.rounds} rounds; "
          f"provisioned persistence {args.persistence}")
    for workload, runs in results.items():
        p = statistics.median(runs["provisioned"])
        q = statistics.median(runs["plain"])
        print(f"{workload:12s} provisioned {p:10.0f} ops/s   plain {q:10.0f} ops/s   ratio {p / q:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
