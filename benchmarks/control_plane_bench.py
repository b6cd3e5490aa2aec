"""Control-plane reads: what does `caiplatform serve` cost per request over a bare Starlette route?

Starts `caiplatform serve` on the embedded defaults (a fresh data dir) and a bare Starlette JSON route
on the same uvicorn settings, signs in, deploys one Python function, then alternates rounds of
`GET /v1/auth/me` (session token) and `GET /v1/agents/{name}` against the bare route, each over 8
keep-alive connections, and prints requests per second with the ratio platform / bare.

    python benchmarks/control_plane_bench.py [--seconds 3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tarfile
import tempfile
from pathlib import Path

import httpx
from benchsupport import QUICK, Row, bare_app, interleaved, median, report, requests_per_second

from caiplatform.testing.http import ADMIN_EMAIL, ADMIN_PASSWORD
from caiplatform.testing.serve import ServeProcess

CONNECTIONS = 8
TARGET = 0.5
# The rate limiter stays on (its cost is part of every request); its budget is just out of reach.
UNLIMITED = {"RATELIMIT_RPS": "1000000000", "RATELIMIT_BURST": "1000000000"}


def function_tarball() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = b"def handle(event, context):\n    return {'echo': event}\n"
        info = tarfile.TarInfo("main.py")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


async def main(seconds: float, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="cai-cp-bench-") as tmp:
        work = Path(tmp)
        bare, bare_port = bare_app(work)
        try:
            with ServeProcess(work / "data", env=UNLIMITED) as server:
                token = httpx.post(f"{server.base_url}/v1/auth/login",
                                   json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}).json()["token"]
                auth = {"Authorization": f"Bearer {token}"}
                deployed = httpx.post(f"{server.base_url}/v1/agents", params={"project": "default"}, headers=auth,
                                      data={"name": "bench", "framework": "function"},
                                      files={"code": ("code.tar.gz", function_tarball(), "application/gzip")})
                assert deployed.status_code == 202, deployed.text
                assert httpx.get(f"{server.base_url}/v1/agents/bench", headers=auth).status_code == 200

                def rate(port: int, path: str, headers: dict[str, str]):
                    return lambda: requests_per_second(port, path, headers, connections=CONNECTIONS, seconds=seconds)

                await rate(server.port, "/v1/auth/me", auth)()  # warm both
                await rate(bare_port, "/v1/auth/me", {})()
                got = await interleaved(rounds, me=rate(server.port, "/v1/auth/me", auth),
                                        agent=rate(server.port, "/v1/agents/bench", auth),
                                        bare=rate(bare_port, "/v1/auth/me", {}))
        finally:
            bare.stop()
    bare_rate = median(got["bare"])
    print(f"control plane: {rounds} interleaved rounds of {seconds:.0f} s, {CONNECTIONS} keep-alive connections")
    rows = []
    for key, label in (("me", "GET /v1/auth/me, session token"), ("agent", "GET /v1/agents/{name}")):
        ratio = median(got[key]) / bare_rate
        rows.append(Row(label, f"{median(got[key]):.0f} req/s", f"bare Starlette route {bare_rate:.0f} req/s",
                        f"{ratio:.2f}", f"≥ {TARGET}", ratio >= TARGET))
    report(*rows)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5 if QUICK else 3.0)
    parser.add_argument("--rounds", type=int, default=3 if QUICK else 5)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds))
