"""Requests for `<name>-<short>.<apps_domain>` reach the registered upstream, streamed both ways."""

from __future__ import annotations

import asyncio

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from caiplatform.routing import Upstream
from caiplatform.testing.engines import free_port


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "query": request.url.query, "body": (await request.body()).decode(),
                         "forwarded_host": request.headers.get("x-forwarded-host")})


async def test_host_routed_requests_are_proxied(client, platform):
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/{p:path}", echo, methods=["GET", "POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    released = []
    try:
        while not server.started:
            await asyncio.sleep(0.05)

        async def upstream() -> Upstream:
            async def release() -> None:
                released.append(True)

            return Upstream(f"http://127.0.0.1:{port}", release)

        host = platform.hosts.host_for("hello", "abc123")
        assert host == "hello-abc123.apps.localhost"
        platform.hosts.register(host, upstream)
        response = await client.post("/invoke?x=1", content=b"payload", headers={"Host": host})
        assert response.status_code == 200
        assert response.json() == {"path": "/invoke", "query": "x=1", "body": "payload", "forwarded_host": host}
        assert response.headers["x-request-id"] and released == [True]
        # An unknown host under the apps domain is a 404 in the envelope, never the platform API.
        missing = await client.get("/healthz", headers={"Host": "nobody-abc123.apps.localhost"})
        assert missing.status_code == 404 and missing.json()["error"] == "not found"
        platform.hosts.unregister(host)
        assert (await client.get("/x", headers={"Host": host})).status_code == 404
    finally:
        server.should_exit = True
        await task


async def test_the_proxy_passes_no_forwarding_header_the_caller_chose(client, platform):
    """Issue 34: a caller's `X-Forwarded-For`, `X-Forwarded-Host`, `Forwarded` and `X-Real-IP` are dropped; the
    workload gets one of each from the platform (the address the platform resolved for the caller)."""
    seen: list[dict[str, list[str]]] = []

    async def headers(request: Request) -> JSONResponse:
        seen.append({k: request.headers.getlist(k) for k in
                     ("x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "forwarded", "x-real-ip")})
        return JSONResponse({})

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/{p:path}", headers)]), host="127.0.0.1",
                                           port=port, log_level="warning", proxy_headers=False))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.05)

        async def upstream() -> Upstream:
            async def release() -> None:
                return None
            return Upstream(f"http://127.0.0.1:{port}", release)

        host = platform.hosts.host_for("fwd", "abc123")
        platform.hosts.register(host, upstream)
        response = await client.get("/x", headers={"Host": host, "X-Forwarded-For": "198.51.100.7",
                                                   "X-Forwarded-Host": "other-abc123.apps.localhost",
                                                   "Forwarded": "for=198.51.100.7", "X-Real-IP": "198.51.100.7"})
        assert response.status_code == 200, response.text
        assert len(seen[0]["x-forwarded-for"]) == 1 and "198.51.100.7" not in seen[0]["x-forwarded-for"][0], seen
        assert seen[0]["x-forwarded-host"] == [host] and seen[0]["forwarded"] == [] and seen[0]["x-real-ip"] == []
        assert seen[0]["x-forwarded-proto"] == ["http"]
    finally:
        server.should_exit = True
        await task
