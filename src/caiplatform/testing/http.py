"""Test helpers: an in-process HTTP client over the ASGI app, and signed-in principals."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import httpx

from caiplatform.platform import Platform

ADMIN_EMAIL = "admin@example.com"
ADMIN_PASSWORD = "correct horse battery staple"


@asynccontextmanager
async def asgi_client(platform: Platform, apis: Sequence[str] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to `create_app(platform)` in-process (no sockets)."""
    from caiplatform_server.app import ALL_APIS, create_app

    app = create_app(platform, apis=apis or ALL_APIS, manage_lifecycle=False)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
        yield client


async def login(client: httpx.AsyncClient, email: str = ADMIN_EMAIL, password: str = ADMIN_PASSWORD) -> dict[str, str]:
    """Sign in and return the Authorization header to send."""
    response = await client.post("/v1/auth/login", json={"email": email, "password": password})
    response.raise_for_status()
    return {"Authorization": f"Bearer {response.json()['token']}"}


def healthz_probe(port: int) -> Callable[[], Awaitable[bool]]:
    """A `ProcessSpec.health` probe: the process on this loopback port answers `GET /healthz` with 200."""

    async def healthy() -> bool:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    return healthy
