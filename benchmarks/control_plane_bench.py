"""Control-plane reads: what does `caiplatform serve` cost per request over a bare Starlette route?

Starts `caiplatform serve` on the embedded defaults (a fresh data dir), a bare Starlette JSON route on
the same uvicorn settings, a FastAPI route whose dependency makes one worker-thread round trip (as the
platform's credential read does), and uvicorn alone (a raw ASGI app answering fixed bytes, the floor of
any Python route), signs in, deploys one Python function and the echo LangGraph agent, invokes the latter
(so it has a warm instance: issue 35's shape, where the view once cost 2.4 ms of CPU), then alternates
rounds of `GET /v1/auth/me` (session token), `GET /v1/agents/{name}` of the function and of the warm agent
against the bare route, each over 8 keep-alive connections, and prints requests per second with the ratio
platform / bare. A second `caiplatform serve` traces every request (OTEL_EXPORTER_OTLP_ENDPOINT on a local
OTLP/HTTP sink) and its `/v1/auth/me` runs in the same rounds: the cost of tracing on, against the first
server's (tracing off, the default). Then the project grows (issue 35's thousand agents): agent records are added beside the
function, copies of its row (records only: a thousand deploys would start a thousand instances for their
readiness proofs, which does not fit on two cores; the route reads records, and asks the runtime for one
address), and at 10, 100 and 1,000 agents in the project `GET /v1/agents/{name}` of the function alternates
with the bare route again; a table and a plot (`docs/agents_growth.svg`) show the cost against the count.

    python benchmarks/control_plane_bench.py [--seconds 3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import tempfile
import uuid
from pathlib import Path

from benchsupport import (
    FLOOR_APP,
    QUICK,
    UVICORN_APP,
    Row,
    bare_app,
    interleaved,
    line_chart_svg,
    median,
    report,
    requests_per_second,
)
from served import served

from caiplatform.testing.otlp import OTLPReceiver

CONNECTIONS = 8
TARGET = 0.5
TRACED_TARGET = 0.6  # tracing on (every request sampled), against off; a ratio sampler costs less
GROWTH = (10, 100, 1000)  # agents in the project
DOCS = Path(__file__).resolve().parents[1] / "docs"


def add_agents(database: Path, like: str, until: int) -> None:
    """Copies of agent `like`'s record (new id and name, no embed key or workload key) until its project holds
    `until` agents."""
    with sqlite3.connect(database) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(agents)")]
        row = dict(zip(columns, db.execute(f"SELECT {', '.join(columns)} FROM agents WHERE name = ?", (like,)).fetchone(),
                       strict=True))
        have = db.execute("SELECT count(*) FROM agents WHERE project_id = ?", (row["project_id"],)).fetchone()[0]
        copies = [{**row, "id": str(uuid.uuid4()), "name": f"{like}-{n:04d}", "embed_key": None, "workload_key_id": None,
                   "workload_key": None} for n in range(have, until)]
        db.executemany(f"INSERT INTO agents ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})", copies)


async def main(seconds: float, rounds: int) -> None:
    growth: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="cai-cp-bench-") as tmp:
        work = Path(tmp)
        bare, bare_port = bare_app(work)
        floor, floor_port = bare_app(work, FLOOR_APP, "floor_app")
        raw, raw_port = bare_app(work, UVICORN_APP, "uvicorn_app")
        try:
            with OTLPReceiver(keep=False).serve() as sink, served(work / "data") as server, \
                    served(work / "traced", OTEL_EXPORTER_OTLP_ENDPOINT=sink, OTEL_SERVICE_NAME="bench") as traced:
                auth = server.auth
                server.deploy("bench", framework="function")
                server.deploy("echo")
                server.wait_ready("bench")
                server.wait_ready("echo")
                server.http.post("/v1/agents/echo/invoke", json={"message": "warm?"}).raise_for_status()

                def rate(port: int, path: str, headers: dict[str, str]):
                    return lambda: requests_per_second(port, path, headers, connections=CONNECTIONS, seconds=seconds)

                await rate(server.port, "/v1/auth/me", auth)()  # warm both
                await rate(bare_port, "/v1/auth/me", {})()
                await rate(traced.port, "/v1/auth/me", traced.auth)()
                got = await interleaved(rounds, me=rate(server.port, "/v1/auth/me", auth),
                                        traced=rate(traced.port, "/v1/auth/me", traced.auth),
                                        agent=rate(server.port, "/v1/agents/bench", auth),
                                        warm=rate(server.port, "/v1/agents/echo", auth),
                                        bare=rate(bare_port, "/v1/auth/me", {}),
                                        floor=rate(floor_port, "/v1/auth/me", {}),
                                        uvicorn=rate(raw_port, "/v1/auth/me", {}))
                for count in GROWTH:
                    add_agents(work / "data" / "platform.db", "bench", count)
                    grown = await interleaved(rounds, agent=rate(server.port, "/v1/agents/bench", auth),
                                              bare=rate(bare_port, "/v1/auth/me", {}))
                    growth[count] = (median(grown["agent"]), median(grown["bare"]))
        finally:
            bare.stop()
            floor.stop()
            raw.stop()
    bare_rate = median(got["bare"])
    print(f"control plane: {rounds} interleaved rounds of {seconds:.0f} s, {CONNECTIONS} keep-alive connections")
    rows = []
    for key, label in (("me", "GET /v1/auth/me, session token"), ("agent", "GET /v1/agents/{name}"),
                       ("warm", "GET /v1/agents/{name}, a warm LangGraph agent")):
        ratio = median(got[key]) / bare_rate
        rows.append(Row(label, f"{median(got[key]):.0f} req/s", f"bare Starlette route {bare_rate:.0f} req/s",
                        f"{ratio:.2f}", f"≥ {TARGET}", ratio >= TARGET,
                        note=f"floor: uvicorn alone {median(got['uvicorn']):.0f} req/s, ratio "
                             f"{median(got['uvicorn']) / bare_rate:.2f}; a FastAPI route with one worker-thread hop "
                             f"{median(got['floor']):.0f} req/s, ratio {median(got['floor']) / bare_rate:.2f}"))
    traced_ratio = median(got["traced"]) / median(got["me"])
    rows.append(Row("GET /v1/auth/me, tracing on (every request sampled and exported)",
                    f"{median(got['traced']):.0f} req/s", f"tracing off {median(got['me']):.0f} req/s",
                    f"{traced_ratio:.2f}", f"≥ {TRACED_TARGET}", traced_ratio >= TRACED_TARGET,
                    note="root span, the credential's SQL spans, BatchSpanProcessor to a local OTLP/HTTP sink"))
    print("  agents in the project | GET /v1/agents/{name} | bare route | ratio | time per request")
    for count, (agent, bare) in growth.items():
        print(f"  {count:>21} | {agent:>15.0f} req/s | {bare:>6.0f} req/s | {agent / bare:.2f} | {1000 / agent:.2f} ms")
    points = list(growth)
    plot = line_chart_svg(DOCS / "agents_growth.svg", "GET /v1/agents/{name} against the agents in its project",
                          "agents in the project", points,
                          {"platform (1 / rate)": [1 / growth[p][0] for p in points],
                           "bare route (1 / rate)": [1 / growth[p][1] for p in points]}, log_x=True)
    print(f"  plot: docs/{plot.name}")
    most = points[-1]
    agent, bare = growth[most]
    rows.append(Row(f"GET /v1/agents/{{name}}, {most} agents in the project", f"{agent:.0f} req/s",
                    f"bare Starlette route {bare:.0f} req/s", f"{agent / bare:.2f}", f"≥ {TARGET}", agent / bare >= TARGET,
                    note=f"at {points[0]} agents {growth[points[0]][0] / growth[points[0]][1]:.2f} of the bare route"))
    report(*rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0 if QUICK else 3.0)
    parser.add_argument("--rounds", type=int, default=3 if QUICK else 5)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds))
