"""How long from `caiplatform serve` starting to the first answered invoke of an already deployed agent?

Deploys N echo LangGraph agents (one node, no model) on the embedded defaults, invokes them, stops the
server, then per round starts it again on the same data dir and times, from the process's start:

- up: the first answer of `GET /healthz`;
- first invoke, warm at the stop: `POST /v1/agents/a0/invoke` answered 200, for an agent that had an
  instance when the server stopped, as all N had (the shape of busy agents when the operator restarts);
- first invoke, cold at the stop: the same, in a restart of its own, for an agent that had scaled to zero
  before the stop (its instance starts on the invoke), the N others warm at the stop as before.

The baseline, measured in the same run between rounds: the server's interpreter importing the server and
the framework, nothing else (`import caiplatform_server.app, langgraph.graph`), which any restart pays.
The rows: the first invoke, warm and cold, for the largest N, against the target of issue 35 (≤ 2.5 s);
the table shows how each grows with N (1, 10, 30; quick: 1 and 10) and the plot is saved beside
docs/performance.md (`restart.svg`).

    python benchmarks/restart_bench.py [--rounds 3] [--agents 1,10,30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, line_chart_svg, report
from served import UNLIMITED, served

from caiplatform.testing.engines import free_port
from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD

TARGET = 2.5
DOCS = Path(__file__).resolve().parents[1] / "docs"
IDLE_SECONDS = "3"  # instances stop after 3 idle seconds, so "cold" agents can be made cold before the stop


def timed_restart(data_dir: Path, token: dict[str, str], agent: str, keep_warm: list[str], cold: str,
                  log: Path) -> tuple[float, float]:
    """(up, first invoke of `agent`) in seconds from the process's start; then the shape is set again for the
    next stop: `keep_warm` invoked, `cold` idled out."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, **UNLIMITED, "CAI_ADMIN_EMAIL": ADMIN_EMAIL, "CAI_ADMIN_PASSWORD": ADMIN_PASSWORD,
           "CAI_SCALE_TO_ZERO_SECONDS": IDLE_SECONDS}
    started = time.monotonic()
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "caiplatform", "serve", "--port", str(port), "--data-dir",
                                 str(data_dir)], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        up = None
        deadline = started + 120
        while up is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"caiplatform serve did not answer; see {log}")
            try:
                httpx.get(f"{base}/healthz", timeout=2)
                up = time.monotonic() - started
            except httpx.HTTPError:
                time.sleep(0.01)
        answer = httpx.post(f"{base}/v1/agents/{agent}/invoke", json={"message": "back?"}, headers=token, timeout=120)
        first = time.monotonic() - started
        if answer.status_code != 200:
            raise SystemExit(f"invoke of {agent} after the restart: {answer.status_code} {answer.text[:300]}")
        settle(base, token, keep_warm, cold)
    finally:
        proc.terminate()
        proc.wait(60)
    return up, first


def settle(base: str, token: dict[str, str], keep_warm: list[str], cold: str) -> None:
    """Before a stop: every agent of `keep_warm` has an instance, `cold` has none (it idles out)."""
    deadline = time.monotonic() + 60
    while True:
        for name in keep_warm:
            httpx.post(f"{base}/v1/agents/{name}/invoke", json={"message": "hi"}, headers=token, timeout=120).raise_for_status()
        if not httpx.get(f"{base}/v1/agents/{cold}/metrics", headers=token, timeout=10).json().get("instances"):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"{cold} did not scale to zero")
        time.sleep(0.5)


def imports(python: str) -> float:
    started = time.monotonic()
    subprocess.run([python, "-c", "import caiplatform_server.app, langgraph.graph"], check=True)
    return time.monotonic() - started


def measure(count: int, rounds: int, work: Path) -> dict[str, list[float]]:
    data = work / f"agents-{count}" / "data"
    data.parent.mkdir(parents=True)
    warm = [f"a{i}" for i in range(count)]
    with served(data, CAI_SCALE_TO_ZERO_SECONDS=IDLE_SECONDS) as platform:
        for name in [*warm, "coldone"]:
            platform.deploy(name)
        for name in [*warm, "coldone"]:
            platform.wait_ready(name)
        settle(platform.base_url, platform.auth, warm, "coldone")
        token = platform.auth
    got: dict[str, list[float]] = {"up": [], "warm": [], "cold": [], "imports": []}
    for round_ in range(rounds):
        got["imports"].append(imports(sys.executable))
        for shape, agent in (("warm", "a0"), ("cold", "coldone")):
            up, first = timed_restart(data, token, agent, warm, "coldone", work / f"serve-{count}-{round_}.log")
            got["up"].append(up)
            got[shape].append(first)
    return got


def main(rounds: int, counts: list[int]) -> None:
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cai-restart-bench-") as tmp:
        for count in counts:
            got = measure(count, rounds, Path(tmp))
            results[count] = {key: statistics.median(values) for key, values in got.items()}
    print("restart: caiplatform serve on the embedded defaults, N echo LangGraph agents deployed (the ones called "
          f"before the stop kept warm), medians of {rounds} restarts, seconds from the process's start")
    print(f"  {'agents':>6} | {'up':>6} | {'first invoke, warm at stop':>26} | {'cold at stop':>12} | {'imports alone':>13}")
    for count, r in results.items():
        print(f"  {count:>6} | {r['up']:>6.2f} | {r['warm']:>26.2f} | {r['cold']:>12.2f} | {r['imports']:>13.2f}")
    points = list(results)
    plot = line_chart_svg(DOCS / "restart.svg", "Restart to the first answered invoke (median)", "agents deployed",
                          points, {name: [results[p][key] for p in points] for name, key in
                                   (("warm at stop", "warm"), ("cold at stop", "cold"), ("up", "up"),
                                    ("imports alone", "imports"))})
    print(f"  plot: docs/{plot.name}")
    last = results[points[-1]]
    report(*(Row(f"Restart to first invoke, {points[-1]} agents, {shape} at the stop", f"{last[key]:.2f} s",
                 f"imports alone {last['imports']:.2f} s", f"{last[key] / last['imports']:.2f}", f"≤ {TARGET} s",
                 last[key] <= TARGET, note=f"up (first /healthz answer) {last['up']:.2f} s")
             for shape, key in (("warm", "warm"), ("cold", "cold"))))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 3)
    parser.add_argument("--agents", default="1,10" if QUICK else "1,10,30")
    args = parser.parse_args()
    main(args.rounds, [int(n) for n in args.agents.split(",")])
