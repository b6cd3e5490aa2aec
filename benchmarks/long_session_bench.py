"""Does a turn cost more late in a long session? Invoke at turn 1, 100, 300 (and 1,000) of one session.

Starts `caiplatform serve` on the embedded defaults (SQLite sessions) and deploys the echo LangGraph
agent. Two sessions grow in lockstep, one turn each in turn (the order alternating), so both are always
at the same turn:

- platform: `POST /v1/agents/echo/invoke` on one session;
- harness: `POST /invoke` on the agent's harness directly (over its instance's Unix socket, with the body,
  ids and secrets the platform sends) on another session: the baseline at the same turn;
- fresh: the platform path with a new session every call: what a turn costs with no history at all.

At each point (turn 1, 100, 300, 1,000; the quick mode stops at 300) the p50 and p99 of a window of turns
starting there are printed as a table; the rows are the platform's added time over the harness at turn 1
and at the last point, and the growth of the platform's turn from turn 1 to the last point. The curve is
saved beside docs/performance.md: `long_session.png` with matplotlib, else `long_session.svg`.

    python benchmarks/long_session_bench.py [--turns 1000] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, line_chart_svg, ms, percentile, report, signed_ms
from served import HarnessEndpoint, served

AGENT = "echo"
DOCS = Path(__file__).resolve().parent.parent / "docs"
TARGET_P50, TARGET_P99, TARGET_GROWTH = 0.002, 0.005, 1.25


async def timed(client: httpx.AsyncClient, url: str, body: dict, headers: dict[str, str]) -> float:
    start = time.perf_counter()
    response = await client.post(url, json=body, headers=headers)
    response.raise_for_status()
    return time.perf_counter() - start


async def timed_direct(client: httpx.AsyncClient, turn: tuple[bytes, dict[str, str]]) -> float:
    body, headers = turn
    start = time.perf_counter()
    response = await client.post("http://harness/invoke", content=body, headers=headers)
    response.raise_for_status()
    return time.perf_counter() - start


async def measure(base_url: str, auth: dict[str, str], harness: HarnessEndpoint, turns: int) -> dict[str, list[float]]:
    platform_url = f"{base_url}/v1/agents/{AGENT}/invoke"
    long_platform, long_direct = f"bench-long-p-{uuid.uuid4().hex[:8]}", f"bench-long-d-{uuid.uuid4().hex[:8]}"
    out: dict[str, list[float]] = {"platform": [], "harness": [], "fresh": []}
    async with httpx.AsyncClient(timeout=60) as client, harness.client() as direct:
        for _ in range(10):  # warm the paths and their connections (fresh sessions: the long ones start at turn 1)
            await timed(client, platform_url, {"message": "warm", "session_id": f"w-{uuid.uuid4().hex}",
                                               "user_id": "bench"}, auth)
            await timed_direct(direct, harness.turn("warm", f"w-{uuid.uuid4().hex}", "bench"))
        for turn in range(turns):
            calls = [
                ("platform", lambda t=turn: timed(client, platform_url, {
                    "message": f"turn {t}", "session_id": long_platform, "user_id": "bench"}, auth)),
                ("harness", lambda t=turn: timed_direct(direct, harness.turn(f"turn {t}", long_direct, "bench"))),
                ("fresh", lambda t=turn: timed(client, platform_url, {
                    "message": f"turn {t}", "session_id": f"f-{uuid.uuid4().hex}", "user_id": "bench"}, auth)),
            ]
            shift = turn % len(calls)
            for name, call in calls[shift:] + calls[:shift]:
                out[name].append(await call())
    return out


def windows(values: list[float], points: list[int], width: int) -> dict[int, list[float]]:
    return {p: values[p - 1: p - 1 + width] for p in points}


def save_plot(points: list[int], series: dict[str, list[float]]) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        return save_svg(points, series)
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, values in series.items():
        axes.plot(points, [v * 1000 for v in values], marker="o", label=name)
    axes.set_xlabel("turn of the session")
    axes.set_ylabel("p50 per turn (ms)")
    axes.set_title("Buffered invoke, echo LangGraph agent, one session")
    axes.legend()
    path = DOCS / "long_session.png"
    figure.savefig(path, dpi=100, bbox_inches="tight")
    return path


def save_svg(points: list[int], series: dict[str, list[float]]) -> Path:
    """A line chart without matplotlib: turn (log scale) against p50 per turn."""
    return line_chart_svg(DOCS / "long_session.svg", "Buffered invoke, echo LangGraph agent, one session: p50 per turn",
                          "turn (log scale)", points, series, log_x=True)


async def main(turns: int, width: int) -> None:
    points = [p for p in (1, 100, 300, 1000) if p <= turns]
    with tempfile.TemporaryDirectory(prefix="cai-long-session-bench-") as tmp, \
            served(Path(tmp) / "data", CAI_SCALE_TO_ZERO_SECONDS="3600") as platform:
        platform.deploy(AGENT)
        platform.wait_ready(AGENT)
        httpx.post(f"{platform.base_url}/v1/agents/{AGENT}/invoke", json={"message": "hi"}, timeout=300).raise_for_status()
        harness = platform.harness_endpoints()[AGENT]
        got = await measure(platform.base_url, platform.auth, harness, points[-1] + width - 1)

    at = {name: windows(values, points, width) for name, values in got.items()}
    print(f"long session: turns 1 to {points[-1] + width - 1} of one session, each point the {width} turns from it; "
          "echo LangGraph agent on caiplatform serve (SQLite sessions)")
    print(f"  {'turn':>6} | {'platform p50':>12} {'p99':>9} | {'harness p50':>11} {'p99':>9} | "
          f"{'added p50':>9} {'p99':>9} | {'fresh session p50':>17}")
    for p in points:
        pl, ha, fr = at["platform"][p], at["harness"][p], at["fresh"][p]
        print(f"  {p:>6} | {ms(percentile(pl, 50)):>12} {ms(percentile(pl, 99)):>9} | {ms(percentile(ha, 50)):>11} "
              f"{ms(percentile(ha, 99)):>9} | {signed_ms(percentile(pl, 50) - percentile(ha, 50)):>9} "
              f"{signed_ms(percentile(pl, 99) - percentile(ha, 99)):>9} | {ms(percentile(fr, 50)):>17}")
    plot = save_plot(points, {name: [percentile(at[name][p], 50) for p in points] for name in at})
    print(f"  plot: docs/{plot.name}")

    def added(p: int, q: float) -> float:
        return percentile(at["platform"][p], q) - percentile(at["harness"][p], q)

    last = points[-1]
    growth = percentile(at["platform"][last], 50) / percentile(at["platform"][1], 50)
    harness_growth = percentile(at["harness"][last], 50) / percentile(at["harness"][1], 50)
    rows = []
    for p in (1, last):
        rows += [
            Row(f"Invoke at turn {p} of one session, added p50", ms(percentile(at["platform"][p], 50)),
                f"harness directly at turn {p} {ms(percentile(at['harness'][p], 50))}", signed_ms(added(p, 50)),
                f"added ≤ {ms(TARGET_P50)}", added(p, 50) <= TARGET_P50),
            Row(f"Invoke at turn {p} of one session, added p99", ms(percentile(at["platform"][p], 99)),
                f"harness directly at turn {p} {ms(percentile(at['harness'][p], 99))}", signed_ms(added(p, 99)),
                f"added ≤ {ms(TARGET_P99)}", added(p, 99) <= TARGET_P99),
        ]
    rows.append(Row(f"Invoke, turn {last} against turn 1 of one session (p50)", ms(percentile(at["platform"][last], 50)),
                    f"turn 1 {ms(percentile(at['platform'][1], 50))}", f"{growth:.2f}", f"≤ {TARGET_GROWTH}",
                    growth <= TARGET_GROWTH, note=f"the harness alone: {harness_growth:.2f}"))
    report(*rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=300 if QUICK else 1000, help="the last point (1, 100, 300, 1000)")
    parser.add_argument("--window", type=int, default=10 if QUICK else 20)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.window))
