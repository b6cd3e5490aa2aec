"""The test session's apps share FastAPI's per-route handlers (`caiplatform.testing.http.shared_route_handlers`,
on for every test by tests/conftest.py): each app still answers from its own platform."""

from __future__ import annotations

from fastapi.routing import _EffectiveRouteContext

from caiplatform.clock import ManualClock
from caiplatform.platform import Platform
from caiplatform.testing.http import asgi_client, login, shared_route_handlers


async def test_apps_sharing_handlers_answer_from_their_own_platform(settings):
    first, second = (Platform.in_memory(settings, clock=ManualClock()) for _ in range(2))
    try:
        await first.start()
        await second.start()
        async with asgi_client(first) as a, asgi_client(second) as b:
            made = await a.post("/v1/projects", headers=await login(a), json={"slug": "only-in-a", "name": "A"})
            assert made.status_code == 201, made.text
            slugs_a = {p["slug"] for p in (await a.get("/v1/projects", headers=await login(a))).json()["projects"]}
            slugs_b = {p["slug"] for p in (await b.get("/v1/projects", headers=await login(b))).json()["projects"]}
    finally:
        await first.aclose()
        await second.aclose()
    assert "only-in-a" in slugs_a and "only-in-a" not in slugs_b


def test_sharing_is_on_in_tests_and_ends_with_its_block():
    shared = _EffectiveRouteContext.__dict__["from_api_route"]
    with shared_route_handlers() as on:
        assert on, "FastAPI's internals changed: every app builds its handlers again (slower unit tests)"
        assert _EffectiveRouteContext.__dict__["from_api_route"] is not shared
    assert _EffectiveRouteContext.__dict__["from_api_route"] is shared
