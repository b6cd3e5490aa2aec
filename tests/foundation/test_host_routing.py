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
