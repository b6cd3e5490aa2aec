"""Test helpers: an in-process HTTP client over the ASGI app, and signed-in principals."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any

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


@contextmanager
def shared_route_handlers() -> Iterator[bool]:
    """Within this block, apps made by `create_app` share the request handlers FastAPI builds for the
    routes of the API modules' routers, instead of each app building its own on its first request.

    Every test makes a new app for its new platform (the app closes over the platform), and FastAPI
    (0.16x) builds an included router's handlers lazily, per app: dependency analysis and pydantic
    adapters for every route of a router, ~0.1 s of CPU per app, more than the rest of an in-memory
    test. A handler depends only on its route (a module-level object) and on how its router was
    included, which is compared in full, except for the app that provides `dependency_overrides`
    (no app of the project has any). A server builds each handler once too: what runs per request is
    the same code. Yields whether sharing is on (False when FastAPI's internals differ from the ones
    this knows: then every app builds its own, as before, only slower)."""
    try:
        from fastapi.routing import _EffectiveRouteContext, _RouterIncludeContext
    except ImportError:
        yield False
        return
    build = _EffectiveRouteContext.__dict__.get("from_api_route")
    if not isinstance(build, classmethod) or not dataclasses.is_dataclass(_RouterIncludeContext):
        yield False
        return
    built: dict[int, list[tuple[object, object, object]]] = {}

    def from_api_route(cls: type, *, original_route: Any, include_context: Any) -> Any:
        how = dataclasses.replace(include_context, dependency_overrides_provider=None)
        for route, seen, context in built.get(id(original_route), ()):
            if route is original_route and seen == how:
                return context
        context = build.__func__(cls, original_route=original_route, include_context=include_context)
        built.setdefault(id(original_route), []).append((original_route, how, context))
        return context

    _EffectiveRouteContext.from_api_route = classmethod(from_api_route)  # type: ignore[method-assign,assignment]
    try:
        yield True
    finally:
        _EffectiveRouteContext.from_api_route = build  # type: ignore[method-assign,assignment]


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
