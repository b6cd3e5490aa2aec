"""What every benchmark shares: a light load generator, the bare baseline app, interleaved rounds, and
the rows `benchmarks/run.py` turns into the table of `docs/performance.md`.

The load generator speaks HTTP/1.1 over raw asyncio streams (keep-alive, one request in flight per
connection) so that the client costs a few microseconds a request and both the platform and its baseline
are measured with the same client in the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from caiplatform.testing.engines import free_port

QUICK = os.environ.get("CAI_BENCH_QUICK") == "1"
RESULTS = os.environ.get("CAI_BENCH_RESULTS")  # JSON lines, one row each, appended


@dataclass
class Row:
    path: str
    platform: str
    baseline: str
    ratio: str
    target: str
    met: bool
    note: str = ""


def report(*rows: Row) -> None:
    for row in rows:
        mark = "met" if row.met else "NOT met"
        print(f"  {row.path}: {row.platform} | baseline {row.baseline} | ratio {row.ratio} | target {row.target}: {mark}"
              + (f" ({row.note})" if row.note else ""))
    if RESULTS:
        with open(RESULTS, "a") as out:
            for row in rows:
                out.write(json.dumps(asdict(row)) + "\n")


def line_chart_svg(path: Path, title: str, x_label: str, points: Sequence[int], series: dict[str, list[float]],
                   *, log_x: bool = False) -> Path:
    """A line chart without matplotlib (the machine may not have it): `points` against each series, in
    milliseconds (the values are seconds)."""
    import math

    width, height, left, bottom, top, right = 640, 360, 60, 40, 30, 130
    top_ms = max(max(v) for v in series.values()) * 1000 * 1.15 or 1
    last = max(points)

    def x_of(p: int) -> float:
        share = (math.log10(p) / math.log10(last) if last > 1 else 0) if log_x else p / last
        return left + (width - left - right) * share

    def y(seconds: float) -> float:
        return height - bottom - (height - bottom - top) * (seconds * 1000 / top_ms)

    xs = {p: x_of(p) for p in points}
    colors = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{left}" y="18">{title}</text>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>']
    for p, x in xs.items():
        parts.append(f'<text x="{x:.0f}" y="{height - bottom + 16}" text-anchor="middle">{p}</text>')
    parts.append(f'<text x="{(width - right + left) / 2:.0f}" y="{height - 6}" text-anchor="middle">{x_label}</text>')
    for i in range(5):
        value = top_ms * i / 4
        yy = height - bottom - (height - bottom - top) * i / 4
        parts.append(f'<text x="{left - 6}" y="{yy + 4:.0f}" text-anchor="end">{value:.0f} ms</text>')
    for i, (name, values) in enumerate(series.items()):
        color = colors[i % len(colors)]
        line = " ".join(f"{xs[p]:.1f},{y(v):.1f}" for p, v in zip(points, values, strict=True))
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{line}"/>')
        for p, v in zip(points, values, strict=True):
            parts.append(f'<circle cx="{xs[p]:.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        parts.append(f'<text x="{width - right + 10}" y="{top + 16 * i + 10}" fill="{color}">{name}</text>')
    parts.append("</svg>\n")
    path.write_text("\n".join(parts))
    return path


def percentile(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def signed_ms(seconds: float) -> str:
    """An added latency, with its sign (a path can come out faster than its baseline in a run)."""
    return f"{seconds * 1000:+.2f} ms"


async def interleaved(rounds: int, **paths: Callable[[], Awaitable[float]]) -> dict[str, list[float]]:
    """Run each path once a round, alternating who goes first, so machine noise hits all alike."""
    out: dict[str, list[float]] = {name: [] for name in paths}
    items = list(paths.items())
    for r in range(rounds):
        for name, fn in items if r % 2 == 0 else reversed(items):
            out[name].append(await fn())
    return out


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


# -- load generation -------------------------------------------------------------------------------


async def _one_connection(port: int, request: bytes, stop_at: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < stop_at:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12]
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            if status != b"200":
                raise RuntimeError(f"the server answered {head[:200]!r}")
            counts[0] += 1
    finally:
        writer.close()


async def requests_per_second(port: int, path: str, headers: dict[str, str], *, connections: int, seconds: float) -> float:
    """GETs per second over `connections` keep-alive connections for `seconds`."""
    lines = [f"GET {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    counts = [0]
    started = time.perf_counter()
    stop_at = started + seconds
    await asyncio.gather(*(_one_connection(port, request, stop_at, counts) for _ in range(connections)))
    return counts[0] / (time.perf_counter() - started)


# -- the bare baseline app --------------------------------------------------------------------------

BARE_APP = """
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route


async def me(request):
    return JSONResponse({"kind": "user", "email": "admin@example.com", "user_id": "0" * 36, "role": "admin"})


app = Starlette(routes=[Route("/v1/auth/me", me), Route("/healthz", me)])
"""

# The floor of a control-plane read in this stack: a FastAPI route behind one async dependency that makes
# one worker-thread round trip (where the platform reads the credential's row), nothing else.
FLOOR_APP = """
import anyio.to_thread
from fastapi import Depends, FastAPI, Request

app = FastAPI()


async def who(request: Request):
    return await anyio.to_thread.run_sync(lambda: {"kind": "user", "email": "admin@example.com"})


@app.get("/v1/auth/me")
async def me(principal=Depends(who)):
    return {**principal, "user_id": "0" * 36, "role": "admin"}


@app.get("/healthz")
async def healthz():
    return {"status": "ok"}
"""

# uvicorn alone: a raw ASGI app answering fixed bytes (the same body as the bare route) on the same server
# settings. What every Python route on uvicorn pays per request before any framework runs.
UVICORN_APP = """
BODY = (b'{"kind":"user","email":"admin@example.com","user_id":"000000000000000000000000000000000000",'
        b'"role":"admin"}')
HEAD = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": HEAD})
    await send({"type": "http.response.body", "body": BODY})
"""

# The floor of a proxied invoke: a bare Starlette route that forwards the body to the harness over one
# pooled httpx client (on the instance's Unix socket, with its secrets, as the platform reaches it) and
# streams the answer back, which is what any Python hop in front of the harness costs on this machine.
PROXY_APP = """
import os

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

HARNESS = "http://harness"
SECRETS = {"X-CAI-Harness-Token": os.environ["BENCH_HARNESS_TOKEN"]}
if os.environ.get("BENCH_INTERNAL_TOKEN"):
    SECRETS["X-CAI-Internal"] = os.environ["BENCH_INTERNAL_TOKEN"]
IDS = ("x-cai-session-id", "x-cai-user-id")
client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=os.environ["BENCH_HARNESS_SOCKET"]), timeout=60)


def headers(request: Request) -> dict[str, str]:
    return {"Content-Type": "application/json", **{k: v for k, v in request.headers.items() if k in IDS}, **SECRETS}


async def invoke(request: Request):
    answer = await client.post(HARNESS + "/invoke", content=await request.body(), headers=headers(request))
    return Response(answer.content, status_code=answer.status_code, media_type="application/json")


async def stream(request: Request):
    upstream = await client.send(client.build_request("POST", HARNESS + "/invoke/stream",
                                                      content=await request.body(), headers=headers(request)), stream=True)

    async def lines():
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def healthz(request: Request):
    return Response("ok")


app = Starlette(routes=[Route("/invoke", invoke, methods=["POST"]), Route("/invoke/stream", stream, methods=["POST"]),
                        Route("/healthz", healthz)])
"""


class Subprocess:
    """A child process started for a benchmark; stopped on exit, its output in a log file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str] | None = None):
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                         start_new_session=True)

    def wait_http(self, url: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.log.name} exited early:\n{self.log.read_text()[-2000:]}")
            try:
                httpx.get(url, timeout=1)
                return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise SystemExit(f"{url} did not answer in {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def bare_app(work: Path, source: str = BARE_APP, name: str = "bare_app", env: dict[str, str] | None = None,
             log_level: str = "info") -> tuple[Subprocess, int]:
    """An app of a few lines on uvicorn, served the way `caiplatform serve` serves its app."""
    (work / f"{name}.py").write_text(source)
    port = free_port()
    proc = Subprocess([sys.executable, "-m", "uvicorn", f"{name}:app", "--port", str(port), "--host", "127.0.0.1",
                       "--log-level", log_level], work / f"{name}.log", env={"PYTHONPATH": str(work), **(env or {})})
    proc.wait_http(f"http://127.0.0.1:{port}/healthz")
    return proc, port


def rss_mib(pid: int) -> float:
    """Resident size of a process and all its descendants, MiB."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out
