"""What does the first invoke after scale to zero cost, beside importing the framework?

Starts `caiplatform serve` (embedded defaults, instances idle out after one second) with an echo
LangGraph agent. Each round waits until the agent has scaled to zero, then times, one after the other:

- the cold invoke through the platform (process start, harness import, framework import, health
  check, first turn);
- the baseline: `import langgraph.graph` in the build's own interpreter, with the instance's environment;
- the split: the bare interpreter (`-c pass`), what the harness's own import adds over the framework's
  (`import langgraph.graph; import caiplatform.harness.app`), and a warm invoke; the rest is the health
  check, the first turn and the platform.

    python benchmarks/coldstart_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, median, report
from served import harness_instances, served

AGENT = "echo"
TARGET = 1.2
BODY = {"message": "cold?"}


def harness_process(pid: int) -> tuple[list[str], dict[str, str]] | None:
    """The instance's argv and variables, their paths as the host sees them: the imports run on the host, and
    the sandbox may show the image, the environment and the home at paths of its own (its binds say where)."""
    for instance in harness_instances(pid):
        return [instance.host_path(instance.argv[0]), *instance.argv[1:]], instance.host_env()
    return None


def timed_python(python: str, env: dict[str, str], code: str) -> float:
    started = time.perf_counter()
    subprocess.run([python, "-c", code], env=env, check=True)
    return time.perf_counter() - started


def main(rounds: int) -> None:
    got: dict[str, list[float]] = {k: [] for k in ("cold", "framework", "bare", "harness", "warm")}
    with tempfile.TemporaryDirectory(prefix="cai-cold-bench-") as tmp, \
            served(Path(tmp) / "data", CAI_SCALE_TO_ZERO_SECONDS="1") as platform:
        platform.deploy(AGENT)
        platform.wait_ready(AGENT)
        url = f"{platform.base_url}/v1/agents/{AGENT}/invoke"
        httpx.post(url, json=BODY, timeout=300).raise_for_status()
        found = harness_process(platform.pid)
        assert found is not None, "no harness instance is running"
        argv, env = found
        python = argv[0]
        with httpx.Client(timeout=300) as client:
            for _ in range(rounds):
                deadline = time.monotonic() + 60
                while harness_process(platform.pid) is not None:
                    assert time.monotonic() < deadline, "the agent did not scale to zero"
                    time.sleep(0.1)
                started = time.perf_counter()
                client.post(url, json=BODY).raise_for_status()
                got["cold"].append(time.perf_counter() - started)
                started = time.perf_counter()
                client.post(url, json=BODY).raise_for_status()
                got["warm"].append(time.perf_counter() - started)
                got["framework"].append(timed_python(python, env, "import langgraph.graph"))
                got["bare"].append(timed_python(python, env, "pass"))
                got["harness"].append(timed_python(python, env, "import langgraph.graph; import caiplatform.harness.app"))
    cold, framework, bare, harness, warm = (median(got[k]) for k in ("cold", "framework", "bare", "harness", "warm"))
    print(f"cold start: {rounds} rounds, echo LangGraph agent, instances idle out after 1 s")
    print(f"  interpreter start            {bare * 1000:8.0f} ms")
    print(f"  framework import             {(framework - bare) * 1000:8.0f} ms")
    print(f"  harness import over that     {(harness - framework) * 1000:8.0f} ms")
    print(f"  warm invoke                  {warm * 1000:8.0f} ms")
    rest = cold - harness - warm
    print(f"  the rest (health check, first turn, platform) {rest * 1000:8.0f} ms")
    ratio = cold / framework
    report(Row("First invoke after scale to zero", f"{cold * 1000:.0f} ms",
               f"`import langgraph.graph` in the build's interpreter {framework * 1000:.0f} ms", f"{ratio:.2f}",
               f"≤ {TARGET}", ratio <= TARGET,
               note=f"interpreter {bare * 1000:.0f} ms, framework import {(framework - bare) * 1000:.0f} ms, "
                    f"harness import {(harness - framework) * 1000:+.0f} ms, warm turn {warm * 1000:.0f} ms, "
                    f"rest {rest * 1000:.0f} ms"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 6)
    main(parser.parse_args().rounds)
